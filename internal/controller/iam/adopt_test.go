package iam

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testAdoption: what the old scripts made (a policy named <ns>-<name> at the path /, a role
// eks-sa-<ns>-<sa> trusting something else, the policy attached; no tags) is a Conflict until
// the objects are annotated quartermaster.dev/adopt, then tagged and managed like the operator's
// own; an AWS object tagged as another Quartermaster object's is never adopted.
func testAdoption(t *testing.T, f *fixture) {
	ctx := context.Background()
	const ns = "t-adopt"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "legacy")
	oldPolicy, err := f.aws.CreatePolicy(ctx, awsiam.NewPolicy{Name: irsa.PolicyName(ns, "reports"), Path: "/",
		Document: `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}]}`})
	must(t, err)
	roleName := irsa.RoleName(ns, "legacy")
	oldRole, err := f.aws.CreateRole(ctx, awsNewRole(roleName))
	must(t, err)
	must(t, f.aws.AttachPolicy(ctx, roleName, oldPolicy.ARN))
	ours := irsa.Tags(testCluster, ns, "reports")

	p := f.policy(t, ns, "reports", "s3:GetObject", "s3:ListBucket")
	sa := f.iamsa(t, ns, "legacy", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "legacy", Policies: []string{"reports"}})

	t.Run("not annotated: Conflict, saying how to adopt, nothing touched", func(t *testing.T) {
		p = waitCondition(t, f, p, ReasonConflict)
		assertStalled(t, p.Status.Conditions, "annotate quartermaster.dev/adopt with its path")
		sa = waitCondition(t, f, sa, ReasonConflict)
		assertStalled(t, sa.Status.Conditions, "annotate quartermaster.dev/adopt=true")
		if f.emu.Calls("TagPolicy")+f.emu.Calls("TagRole") != 0 {
			t.Error("an AWS object was tagged without the annotation")
		}
	})

	annotate := func(obj client.Object, value string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, iamv1alpha1.AnnotationAdopt, value)
		must(t, f.c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(patch))))
	}
	// Whatever a failure leaves would be retried in the background and count in later tests' calls.
	t.Cleanup(func() {
		for _, obj := range []client.Object{sa, p} {
			if err := f.c.Delete(ctx, obj); err == nil {
				f.waitGone(t, obj)
			}
		}
	})

	t.Run("the policy annotated with its path: tagged, then brought to the spec", func(t *testing.T) {
		annotate(p, "/")
		p = waitReady(t, f, p)
		if p.Status.ARN != oldPolicy.ARN {
			t.Errorf("status.arn %s, want the adopted %s", p.Status.ARN, oldPolicy.ARN)
		}
		pol := f.awsPolicy(oldPolicy.ARN)
		if !maps.Equal(tagsOf(pol.Tags), ours) {
			t.Errorf("policy tags %v, want %v", tagsOf(pol.Tags), ours)
		}
		if doc := f.defaultDocument(oldPolicy.ARN); !strings.Contains(doc, "s3:ListBucket") {
			t.Errorf("the adopted policy's default document is still the old one: %s", doc)
		}
	})

	t.Run("the role holding an inline policy it was not given: not adopted, naming it", func(t *testing.T) {
		must(t, f.aws.PutInlinePolicy(ctx, roleName, "scripts-extra", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}`))
		annotate(sa, "true")
		testenv.Eventually(t, "the refusal naming the inline policy", func() (bool, string) {
			must(t, f.c.Get(ctx, client.ObjectKeyFromObject(sa), sa))
			c := meta.FindStatusCondition(sa.Status.Conditions, iamv1alpha1.ConditionReady)
			return c != nil && strings.Contains(c.Message, "scripts-extra"), fmt.Sprint(c)
		})
		assertStalled(t, sa.Status.Conditions, "has inline policies Quartermaster did not put there (scripts-extra)")
		if f.emu.Calls("TagRole") != 0 {
			t.Error("the role was tagged while it held an inline policy")
		}
		must(t, f.aws.DeleteInlinePolicy(ctx, roleName, "scripts-extra"))
	})

	t.Run("the role annotated: tagged, trusting the ServiceAccount, the policy attached", func(t *testing.T) {
		annotate(sa, "true")
		sa = waitReady(t, f, sa)
		role := f.role(roleName)
		if want := irsa.Tags(testCluster, ns, "legacy"); !maps.Equal(tagsOf(role.Tags), want) {
			t.Errorf("role tags %v, want %v", tagsOf(role.Tags), want)
		}
		assertTrust(t, role.AssumeRolePolicyDocument, ns, "legacy")
		if sa.Status.RoleARN != oldRole.ARN || !slices.Equal(role.AttachedPolicies, []string{oldPolicy.ARN}) {
			t.Errorf("role %s with %v, want %s with %s", sa.Status.RoleARN, role.AttachedPolicies, oldRole.ARN, oldPolicy.ARN)
		}
	})

	t.Run("another Quartermaster object's role is never adopted", func(t *testing.T) {
		f.serviceAccount(t, ns, "theirs")
		theirs := irsa.Tags("another-cluster", ns, "theirs")
		_, err := f.aws.CreateRole(ctx, awsiam.NewRole{Name: irsa.RoleName(ns, "theirs"), Path: irsa.Path("another-cluster"),
			TrustPolicy: awsNewRole("").TrustPolicy, Tags: theirs})
		must(t, err)
		other := &iamv1alpha1.IAMServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "theirs", Annotations: map[string]string{iamv1alpha1.AnnotationAdopt: "true"}},
			Spec:       iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "theirs"},
		}
		must(t, f.c.Create(ctx, other))
		defer func() {
			must(t, f.c.Delete(ctx, other))
			f.waitGone(t, other)
		}()
		other = waitCondition(t, f, other, ReasonConflict)
		assertStalled(t, other.Status.Conditions, "tagged as another Quartermaster object's")
		if got := tagsOf(f.role(irsa.RoleName(ns, "theirs")).Tags); !maps.Equal(got, theirs) {
			t.Errorf("the other cluster's role was retagged: %v", got)
		}
	})

	t.Run("adopted objects are the operator's: deleting the objects deletes them", func(t *testing.T) {
		must(t, f.c.Delete(ctx, sa))
		f.waitGone(t, sa)
		must(t, f.c.Delete(ctx, p))
		f.waitGone(t, p)
		if f.role(roleName) != nil || f.awsPolicy(oldPolicy.ARN) != nil {
			t.Error("the adopted role or policy is still in AWS")
		}
	})
}
