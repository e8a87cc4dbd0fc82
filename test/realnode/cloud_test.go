//go:build e2e

package realnode

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

// TestIAMAndVmGroupsFromTheManagerPod: the emulators of AWS IAM (with STS and EKS) and of vCenter
// run where AWS and vCenter would be for a cluster, outside it (on the host, reached through the
// node's link; TestMain starts them, and installs the chart with the iam and vmgroups controllers on
// and their credentials in Secrets, as a platform admin would). The manager's Pods serve an
// IAMServiceAccount (its role made in IAM, its ServiceAccount annotated) and a VmGroup, which
// kubectl scale grows from 1 to 3 VMs in vCenter.
func TestIAMAndVmGroupsFromTheManagerPod(t *testing.T) {
	ctx := context.Background()
	emu, account, template := iamEmulator, awsAccount, vmTemplate
	ns := newNamespace(t, "real-cloud")
	isa := &iamv1alpha1.IAMServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reports"},
		Spec: iamv1alpha1.IAMServiceAccountSpec{
			ServiceAccountName: "reports", CreateServiceAccount: true,
			ManagedPolicyArns: []string{readOnlyARN},
		},
	}
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec:       computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: template, Replicas: ptr.To[int32](1)},
	}
	for _, o := range []client.Object{isa, vg} {
		must(t, admin.Create(ctx, o))
		// The manager removes the role and the VMs before the emulators stop.
		t.Cleanup(func() {
			_ = admin.Delete(ctx, o)
			eventually(t, "the "+o.GetName()+" object to be gone", func() bool {
				return apierrors.IsNotFound(admin.Get(ctx, client.ObjectKeyFromObject(o), o))
			})
		})
	}
	waitReady(t, isa, &isa.Status.Conditions)
	sa := &corev1.ServiceAccount{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "reports"}, sa))
	if arn := sa.Annotations["eks.amazonaws.com/role-arn"]; !strings.HasPrefix(arn, "arn:aws:iam::"+account+":role/") {
		t.Errorf("the ServiceAccount's role-arn annotation: %q", arn)
	}
	if n := emu.Calls("CreateRole"); n != 1 {
		t.Errorf("IAM saw %d CreateRole calls, want 1", n)
	}

	waitReady(t, vg, &vg.Status.Conditions)
	if _, err := cluster.Kubectl(ctx, "scale", "-n", ns, "vmgroup/web", "--replicas=3"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the VmGroup to have 3 ready VMs", func() bool {
		return admin.Get(ctx, client.ObjectKeyFromObject(vg), vg) == nil && vg.Status.ReadyReplicas == 3 &&
			meta.IsStatusConditionTrue(vg.Status.Conditions, "Ready") && vg.Status.ObservedGeneration == vg.Generation
	})
}

// waitReady waits for obj's Ready condition for its current generation.
func waitReady(t *testing.T, obj client.Object, conds *[]metav1.Condition) {
	t.Helper()
	eventually(t, obj.GetName()+" to be Ready", func() bool {
		if admin.Get(context.Background(), client.ObjectKeyFromObject(obj), obj) != nil {
			return false
		}
		c := meta.FindStatusCondition(*conds, "Ready")
		return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == obj.GetGeneration()
	})
}
