package iam

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testInlinePolicies: spec.inlinePolicies are put on the role; a reconcile at rest reads them
// (one list, one read each) and writes nothing; a document that means the same is not rewritten,
// one that differs is, and one changed in IAM by hand is repaired; a policy dropped from the spec
// is deleted from the role, one someone else put is left alone (and blocks deletion, saying so);
// documents over IAM's size limit stall before any call; the API server refuses a name that
// clashes with spec.policies.
func testInlinePolicies(t *testing.T, f *fixture) {
	ctx := context.Background()
	const ns = "t-inline"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "app")
	f.policy(t, ns, "shared", "s3:ListBucket")
	roleName := irsa.RoleName(ns, "app")
	inline := func(name string, actions ...string) iamv1alpha1.InlinePolicy {
		return iamv1alpha1.InlinePolicy{Name: name, Document: document(actions...)}
	}
	sa := f.iamsa(t, ns, "app", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "app", Policies: []string{"shared"},
		InlinePolicies: []iamv1alpha1.InlinePolicy{inline("read-logs", "logs:GetLogEvents"), inline("queue", "sqs:SendMessage")}})
	sa = waitReady(t, f, sa)
	docs := func() map[string]string { return f.role(roleName).InlinePolicies }
	if got := slices.Sorted(maps.Keys(docs())); !slices.Equal(got, []string{"queue", "read-logs"}) || !slices.Equal(sa.Status.InlinePolicies, got) {
		t.Fatalf("inline policies on the role %v, in the status %v", got, sa.Status.InlinePolicies)
	}
	if !strings.Contains(docs()["read-logs"], "logs:GetLogEvents") {
		t.Errorf("read-logs: %s", docs()["read-logs"])
	}

	t.Run("at rest: one list and one read per inline policy, no write", func(t *testing.T) {
		r, sent := f.standaloneServiceAccount(t)
		_, err := r.Reconcile(ctx, request(sa))
		must(t, err)
		if want := map[string]int{"GetRole": 1, "ListAttachedRolePolicies": 1, "ListRolePolicies": 1, "GetRolePolicy": 2}; !maps.Equal(sent.Calls(), want) {
			t.Errorf("IAM calls = %v, want %v", sent.Calls(), want)
		}
	})

	t.Run("changed in IAM by hand: repaired", func(t *testing.T) {
		must(t, f.aws.PutInlinePolicy(ctx, roleName, "queue", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}`))
		r, _ := f.standaloneServiceAccount(t)
		_, err := r.Reconcile(ctx, request(sa))
		must(t, err)
		if doc := docs()["queue"]; !strings.Contains(doc, "sqs:SendMessage") {
			t.Errorf("queue after the repair: %s", doc)
		}
	})

	t.Run("a document that means the same is not rewritten; one that differs is", func(t *testing.T) {
		before := f.emu.State().Calls["PutRolePolicy"]
		update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) {
			s.Spec.InlinePolicies[0].Document.Statement[0].Action = []string{"LOGS:GetLogEvents"} // actions compare case-insensitively
		})
		sa = waitReady(t, f, sa)
		if n := f.emu.State().Calls["PutRolePolicy"] - before; n != 0 {
			t.Errorf("%d PutRolePolicy for a document that means the same", n)
		}
		update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) {
			s.Spec.InlinePolicies[0].Document.Statement[0].Action = []string{"logs:GetLogEvents", "logs:FilterLogEvents"}
		})
		sa = waitReady(t, f, sa)
		testenv.Eventually(t, "read-logs rewritten", func() (bool, string) {
			return strings.Contains(docs()["read-logs"], "logs:FilterLogEvents"), docs()["read-logs"]
		})
	})

	t.Run("dropped from the spec: deleted; one put by hand: left alone", func(t *testing.T) {
		must(t, f.aws.PutInlinePolicy(ctx, roleName, "by-hand", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}]}`))
		update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.InlinePolicies = s.Spec.InlinePolicies[:1] })
		sa = waitReady(t, f, sa)
		testenv.Eventually(t, "queue deleted from the role", func() (bool, string) {
			got := slices.Sorted(maps.Keys(docs()))
			return slices.Equal(got, []string{"by-hand", "read-logs"}), strings.Join(got, ",")
		})
		if !slices.Equal(sa.Status.InlinePolicies, []string{"read-logs"}) {
			t.Errorf("status.inlinePolicies = %v", sa.Status.InlinePolicies)
		}
	})

	t.Run("over IAM's size limit: stalled before any write", func(t *testing.T) {
		before := f.emu.State().Calls["PutRolePolicy"]
		big := inline("big", "s3:GetObject")
		big.Document.Statement[0].Resource = nil
		for i := range 6 { // each within the CRD's 2048 characters, together over IAM's 10240
			big.Document.Statement[0].Resource = append(big.Document.Statement[0].Resource, "arn:aws:s3:::"+strings.Repeat(string(rune('a'+i)), 1900))
		}
		update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.InlinePolicies = append(s.Spec.InlinePolicies, big) })
		sa = waitCondition(t, f, sa, "LimitExceeded")
		assertStalled(t, sa.Status.Conditions, "IAM allows a role 10240")
		if n := f.emu.State().Calls["PutRolePolicy"] - before; n != 0 {
			t.Errorf("%d PutRolePolicy over the limit", n)
		}
		update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.InlinePolicies = s.Spec.InlinePolicies[:1] })
		sa = waitReady(t, f, sa)
	})

	t.Run("a name clashing with spec.policies is refused", func(t *testing.T) {
		bad := sa.DeepCopy()
		bad.Spec.InlinePolicies = append(bad.Spec.InlinePolicies, inline("shared", "s3:GetObject"))
		if err := f.c.Update(ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "an inline policy has the name of an IAMPolicy in spec.policies") {
			t.Errorf("update: %v, want the clash refused", err)
		}
	})

	t.Run("deletion: ours deleted, the one put by hand blocks the role's deletion, saying so", func(t *testing.T) {
		must(t, f.c.Delete(ctx, sa))
		sa = waitCondition(t, f, sa, "DeleteConflict")
		assertStalled(t, sa.Status.Conditions, "someone added an inline policy")
		if got := slices.Sorted(maps.Keys(docs())); !slices.Equal(got, []string{"by-hand"}) {
			t.Errorf("inline policies left: %v, want only by-hand", got)
		}
		must(t, f.aws.DeleteInlinePolicy(ctx, roleName, "by-hand"))
		f.waitGone(t, sa)
		if f.role(roleName) != nil {
			t.Error("role left behind")
		}
	})
}
