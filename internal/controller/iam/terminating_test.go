package iam

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testTerminatingNamespace: in a namespace being deleted (envtest has no namespace controller,
// so it stays Terminating) the API server refuses every creation. The controller still deletes
// the AWS objects, does not try to re-create the ServiceAccount in a fast loop, and records no
// Event the API server would refuse (client-go logs each refusal).
func testTerminatingNamespace(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := "t-terminating"
	f.namespace(t, ns)
	p := waitReady(t, f, f.policy(t, ns, "read", "s3:GetObject"))
	sa := waitReady(t, f, f.iamsa(t, ns, "app", iamv1alpha1.IAMServiceAccountSpec{
		ServiceAccountName: "app", CreateServiceAccount: true, Policies: []string{"read"},
	}))
	must(t, f.c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	// What the namespace controller does first: delete the content, here the ServiceAccount.
	must(t, f.c.Delete(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"}}))
	update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.Policies = nil }) // a reconcile in the terminating namespace
	testenv.Eventually(t, "ServiceAccountNotFound while the namespace goes", func() (bool, string) {
		must(t, f.c.Get(ctx, request(sa).NamespacedName, sa))
		c := status.ReadyOf(sa)
		return c != nil && c.Reason == ReasonServiceAccountNotFound && strings.Contains(c.Message, "being deleted"), ""
	})
	must(t, f.c.Delete(ctx, sa))
	must(t, f.c.Delete(ctx, p))
	f.waitGone(t, sa)
	f.waitGone(t, p)
	if f.role(sa.Status.RoleName) != nil || f.awsPolicy(p.Status.ARN) != nil {
		t.Error("AWS objects left behind")
	}
	for _, refused := range []string{"because it is being terminated", "unable to create new content"} {
		if strings.Contains(logs.String(), refused) {
			t.Errorf("the controller logged a refusal (%q) in the terminating namespace", refused)
		}
	}
}
