package iam

import (
	"context"
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// writes are the calls in calls (the emulator's per-operation counters) that are no reads.
func writes(calls map[string]int) map[string]int {
	out := maps.Clone(calls)
	maps.DeleteFunc(out, func(op string, _ int) bool {
		return strings.HasPrefix(op, "Get") || strings.HasPrefix(op, "List") || strings.HasPrefix(op, "Describe")
	})
	return out
}

// testWithoutIssuer runs the controller without --oidc-issuer (a cluster that uses only EKS Pod
// Identity): a PodIdentity object gets its role, trusting pods.eks.amazonaws.com only, and its
// association; IRSA and Both objects stall (OIDCIssuerNotSet) before any AWS call. The flag is read
// at start: a restart with it makes them Ready. Without it again, a change from Both to PodIdentity
// waits while the IRSA annotation is in place (the role must keep trusting it), and completes once
// it is removed. Deletion needs no issuer.
func testWithoutIssuer(t *testing.T, f *fixture) {
	ctx := context.Background()
	const ns = "t-noissuer"
	noIssuer := f.opts
	noIssuer.OIDCIssuer = ""
	f.run(t, noIssuer)
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "pods")
	f.serviceAccount(t, ns, "both")

	pods := waitReady(t, f, f.iamsa(t, ns, "pods", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "pods", Mechanism: iamv1alpha1.MechanismPodIdentity}))
	t.Run("PodIdentity: a role trusting pods.eks.amazonaws.com only, and the association", func(t *testing.T) {
		assertMechanism(t, f, pods, iamv1alpha1.MechanismPodIdentity)
		want := irsa.TrustPolicy("aws", f.emu.AccountID(), "", ns, "pods", irsa.Parts{Association: true})
		if role := f.role(pods.Status.RoleName); role == nil {
			t.Error("no role")
		} else if same, err := irsa.Equivalent(role.AssumeRolePolicyDocument, want); err != nil || !same {
			t.Errorf("trust policy %s, want %s (%v)", role.AssumeRolePolicyDocument, want, err)
		}
	})

	var irsaSA, both *iamv1alpha1.IAMServiceAccount
	t.Run("IRSA and Both stall with OIDCIssuerNotSet and make no AWS call", func(t *testing.T) {
		// Nothing else is reconciled meanwhile (pods is Ready until its resync): every call would be theirs.
		before := f.emu.State().Calls
		irsaSA = f.iamsa(t, ns, "irsa", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "irsa", CreateServiceAccount: true})
		both = f.iamsa(t, ns, "both", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "both", Mechanism: iamv1alpha1.MechanismBoth})
		irsaSA = waitCondition(t, f, irsaSA, ReasonOIDCIssuerNotSet)
		both = waitCondition(t, f, both, ReasonOIDCIssuerNotSet)
		assertStalled(t, irsaSA.Status.Conditions, "mechanism IRSA needs the cluster's OIDC provider in the role's trust policy and --oidc-issuer is not set (chart value iam.oidcIssuer)")
		assertStalled(t, both.Status.Conditions, "mechanism Both needs")
		assertStalled(t, both.Status.Conditions, "or use mechanism PodIdentity")
		if calls := diffCalls(before, f.emu.State().Calls); len(calls) != 0 {
			t.Errorf("AWS calls: %v", calls)
		}
		st := f.emu.State()
		for _, name := range []string{"irsa", "both"} {
			if f.role(irsa.RoleName(ns, name)) != nil || len(associationsOf(st, ns, name)) != 0 {
				t.Errorf("%s: something was made in AWS", name)
			}
		}
		if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "irsa"}, &corev1.ServiceAccount{}); !apierrors.IsNotFound(err) {
			t.Errorf("the ServiceAccount to create: %v, want not created", err)
		}
		testenv.WaitForEvent(t, f.c, irsaSA, ReasonOIDCIssuerNotSet)
	})

	t.Run("restarted with --oidc-issuer, they become Ready", func(t *testing.T) {
		f.run(t, f.opts)
		irsaSA, both = waitReady(t, f, irsaSA), waitReady(t, f, both)
		assertMechanism(t, f, irsaSA, iamv1alpha1.MechanismIRSA)
		assertMechanism(t, f, both, iamv1alpha1.MechanismBoth)
	})

	t.Run("without it, Both to PodIdentity waits while the IRSA annotation is in place", func(t *testing.T) {
		f.run(t, noIssuer)
		trust := f.role(both.Status.RoleName).AssumeRolePolicyDocument
		before := f.emu.State().Calls
		update(t, f, both, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.Mechanism = iamv1alpha1.MechanismPodIdentity })
		both = waitCondition(t, f, both, ReasonOIDCIssuerNotSet)
		assertStalled(t, both.Status.Conditions, "ServiceAccount both still has this object's IRSA annotation")
		// The restart's reconciles of the Ready objects read; nothing writes.
		if w := writes(diffCalls(before, f.emu.State().Calls)); len(w) != 0 {
			t.Errorf("AWS writes: %v", w)
		}
		if role := f.role(both.Status.RoleName); role == nil || role.AssumeRolePolicyDocument != trust {
			t.Errorf("the role's trust policy changed: %+v", role)
		}
		if a := associationsOf(f.emu.State(), ns, "both"); len(a) != 1 {
			t.Errorf("associations %+v, want the one of Both kept", a)
		}

		// Removed by hand: nothing uses IRSA any more, and the change completes at the next retry.
		update(t, f, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "both"}}, func(s *corev1.ServiceAccount) {
			delete(s.Annotations, iamv1alpha1.AnnotationRoleARN)
		})
		both = waitReady(t, f, both)
		assertMechanism(t, f, both, iamv1alpha1.MechanismPodIdentity)
	})

	t.Run("deletion needs no issuer", func(t *testing.T) {
		for _, sa := range []*iamv1alpha1.IAMServiceAccount{pods, irsaSA, both} {
			must(t, f.c.Delete(ctx, sa))
		}
		for _, sa := range []*iamv1alpha1.IAMServiceAccount{pods, irsaSA, both} {
			f.waitGone(t, sa)
			if f.role(sa.Status.RoleName) != nil || len(associationsOf(f.emu.State(), ns, sa.Spec.ServiceAccountName)) != 0 {
				t.Errorf("%s: left in AWS", sa.Name)
			}
		}
	})
}
