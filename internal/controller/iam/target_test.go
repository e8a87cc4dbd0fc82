package iam

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awseks"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testTargetRole: cross-account Pod Identity. The association leads to spec.targetRoleArn with the
// session tags switch of the spec; the external ID EKS gives it is in the status and the message
// says what the target's trust must hold; the role may assume the target (an inline policy of the
// operator's); an association changed by hand is repaired; a target in this account is read: a
// missing one, or one whose trust lacks the external ID, stalls with the statement to add; a
// dropped target goes from the association and the role; the API server refuses a target with
// IRSA and the operator's inline policy name.
func testTargetRole(t *testing.T, f *fixture) {
	ctx := context.Background()
	const ns = "t-target"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "app")
	roleName := irsa.RoleName(ns, "app")
	const remote = "arn:aws:iam::111122223333:role/data/reader"
	sa := f.iamsa(t, ns, "app", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "app", Mechanism: iamv1alpha1.MechanismPodIdentity, TargetRoleArn: remote})
	sa = waitReady(t, f, sa)
	association := func() iamemulator.AssociationState {
		t.Helper()
		a := associationsOf(f.emu.State(), ns, "app")
		if len(a) != 1 {
			t.Fatalf("associations %v", a)
		}
		return a[0]
	}
	readyMessage := func() string {
		return meta.FindStatusCondition(sa.Status.Conditions, iamv1alpha1.ConditionReady).Message
	}

	t.Run("the association leads to the target; the external ID in the status; the role may assume the target", func(t *testing.T) {
		a := association()
		rec := sa.Status.PodIdentityAssociation
		if a.TargetRoleArn != remote || a.ExternalID == "" || a.DisableSessionTags || rec.TargetRoleARN != remote || rec.ExternalID != a.ExternalID {
			t.Fatalf("association %+v, status %+v", a, rec)
		}
		if msg := readyMessage(); !strings.Contains(msg, "account 111122223333, not readable from here") || !strings.Contains(msg, a.ExternalID) ||
			!strings.Contains(msg, `"Principal":{"AWS":"`+sa.Status.RoleARN+`"}`) {
			t.Errorf("Ready message %q does not say what the target's trust must hold", msg)
		}
		doc := f.role(roleName).InlinePolicies[targetPolicyName]
		if !strings.Contains(doc, `"sts:AssumeRole","sts:TagSession"`) || !strings.Contains(doc, remote) {
			t.Errorf("%s: %s", targetPolicyName, doc)
		}
	})

	t.Run("session tags off: the association and the permission follow", func(t *testing.T) {
		update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.DisableSessionTags = true })
		sa = waitReady(t, f, sa)
		testenv.Eventually(t, "session tags off", func() (bool, string) {
			a := association()
			doc := f.role(roleName).InlinePolicies[targetPolicyName]
			return a.DisableSessionTags && !strings.Contains(doc, "sts:TagSession"), fmt.Sprintf("%+v %s", a, doc)
		})
	})

	t.Run("an association changed by hand: repaired", func(t *testing.T) {
		a := association()
		_, err := f.eks.Update(ctx, &awseks.Association{Cluster: testCluster, ID: a.ID, Target: awseks.Target{RoleARN: remote}}, a.RoleArn,
			awseks.Target{RoleARN: "arn:aws:iam::111122223333:role/someone-elses"})
		must(t, err)
		r, _ := f.standaloneServiceAccount(t)
		_, err = r.Reconcile(ctx, request(sa))
		must(t, err)
		if got := association(); got.TargetRoleArn != remote || !got.DisableSessionTags {
			t.Errorf("after the repair: %+v", got)
		}
	})

	t.Run("a target in this account: read, and its trust checked", func(t *testing.T) {
		account, err := f.aws.AccountID(ctx)
		must(t, err)
		local := "arn:aws:iam::" + account + ":role/shared/target-a"
		update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.TargetRoleArn = local })
		sa = waitCondition(t, f, sa, ReasonTargetRoleNotFound)
		assertStalled(t, sa.Status.Conditions, "target role "+local+" does not exist")

		_, err = f.aws.CreateRole(ctx, awsiam.NewRole{Name: "target-a", Path: "/shared/", TrustPolicy: awsNewRole("").TrustPolicy})
		must(t, err)
		testenv.Eventually(t, "TargetRoleNotTrusting", func() (bool, string) {
			must(t, f.c.Get(ctx, request(sa).NamespacedName, sa))
			c := meta.FindStatusCondition(sa.Status.Conditions, iamv1alpha1.ConditionReady)
			return c != nil && c.Reason == ReasonTargetRoleNotTrusting, fmt.Sprint(c)
		})
		rec := sa.Status.PodIdentityAssociation
		if rec.TargetRoleARN != local || rec.ExternalID == "" || !strings.Contains(readyMessage(), rec.ExternalID) {
			t.Fatalf("status %+v, message %q", rec, readyMessage())
		}
		trust := `{"Version":"2012-10-17","Statement":[` + targetTrust(sa, sa.Status.RoleARN, rec.ExternalID) + `]}`
		must(t, f.aws.UpdateTrustPolicy(ctx, "target-a", trust))
		sa = waitReady(t, f, sa)
		if msg := readyMessage(); !strings.Contains(msg, "pods get target role "+local) {
			t.Errorf("Ready message %q", msg)
		}
	})

	t.Run("the target dropped: gone from the association and the role", func(t *testing.T) {
		update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.TargetRoleArn, s.Spec.DisableSessionTags = "", false })
		sa = waitReady(t, f, sa)
		testenv.Eventually(t, "no target", func() (bool, string) {
			a := association()
			_, perm := f.role(roleName).InlinePolicies[targetPolicyName]
			return a.TargetRoleArn == "" && a.ExternalID == "" && !perm, fmt.Sprintf("%+v, permission %v", a, perm)
		})
		if rec := sa.Status.PodIdentityAssociation; rec.TargetRoleARN != "" || rec.ExternalID != "" {
			t.Errorf("status %+v", rec)
		}
	})

	t.Run("the API server refuses a target with IRSA, and the operator's inline policy name", func(t *testing.T) {
		for _, c := range []struct {
			change func(*iamv1alpha1.IAMServiceAccount)
			want   string
		}{
			{func(s *iamv1alpha1.IAMServiceAccount) {
				s.Spec.Mechanism, s.Spec.TargetRoleArn = iamv1alpha1.MechanismIRSA, remote
			}, "targetRoleArn needs mechanism: PodIdentity"},
			{func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.TargetRoleArn = "arn:aws:iam::111122223333:user/bob" }, "spec.targetRoleArn in body should match"},
			{func(s *iamv1alpha1.IAMServiceAccount) {
				s.Spec.InlinePolicies = []iamv1alpha1.InlinePolicy{{Name: targetPolicyName, Document: document("s3:GetObject")}}
			}, "the inline policy name quartermaster-target-role is the operator's"},
		} {
			bad := sa.DeepCopy()
			c.change(bad)
			if err := f.c.Update(ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("update: %v, want %q", err, c.want)
			}
		}
	})
	must(t, f.c.Delete(ctx, sa))
	f.waitGone(t, sa)
}
