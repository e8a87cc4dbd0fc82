//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
)

// TestVmGroupScalesThroughTheScaleSubresource runs the manager (as its ServiceAccount) against a
// vCenter simulator and scales a VmGroup with kubectl scale, including past the CRD's maximum
// (refused) and past the manager's --vsphere-max-replicas (Stalled, nothing cloned).
func TestVmGroupScalesThroughTheScaleSubresource(t *testing.T) {
	parallel(t, vmgroupsController)
	ctx := context.Background()
	sim := vsimtest.Start(t)
	sim.AddTemplate(t, "e2e-template")
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: managerNamespace, Name: "e2e-vcenter"},
		StringData: map[string]string{"VC_HOST": sim.URL.String(), "VC_USER": sim.User, "VC_PASS": sim.Password},
	}
	must(t, admin.Create(ctx, secret))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), secret) })
	mgr := startManager(t, "--controllers=vmgroups", "--health-probe-bind-address=0",
		"--vsphere-secret="+managerNamespace+"/e2e-vcenter", "--vsphere-insecure", "--vsphere-clone-concurrency=1")

	ns := newNamespace(t)
	manifest := `apiVersion: compute.quartermaster.dev/v1alpha1
kind: VmGroup
metadata: {name: web}
spec: {cpu: 1, memory: 1, template: e2e-template, replicas: 2}
`
	path := t.TempDir() + "/vg.yaml"
	must(t, os.WriteFile(path, []byte(manifest), 0o600))
	if out, err := cluster.Kubectl(ctx, "apply", "-n", ns, "-f", path); err != nil {
		t.Fatal(out, err)
	}
	if out, err := cluster.Kubectl(ctx, "wait", "-n", ns, "vg/web", "--for=condition=Ready", "--timeout=120s"); err != nil {
		t.Fatal(out, err)
	}
	if out, err := cluster.Kubectl(ctx, "scale", "-n", ns, "vg/web", "--replicas=3"); err != nil || !strings.Contains(out, "scaled") {
		t.Fatal(out, err)
	}
	if out, err := cluster.Kubectl(ctx, "wait", "-n", ns, "vg/web", "--for=jsonpath={.status.readyReplicas}=3", "--timeout=120s"); err != nil {
		t.Fatal(out, err)
	}
	if vms := sim.VMs(t, "/DC0/vm/"+ns+"-web"); len(vms) != 3 {
		t.Errorf("vCenter has %d VMs in the group's folder, want 3", len(vms))
	}

	// A typo: above the CRD's maximum, the API server refuses the scale itself.
	if out, err := cluster.Kubectl(ctx, "scale", "-n", ns, "vg/web", "--replicas=1001"); err == nil || !strings.Contains(out, "1000") {
		t.Errorf("kubectl scale --replicas=1001: %v, want refused naming the maximum 1000:\n%s", err, out)
	}
	// Within the CRD but above the manager's --vsphere-max-replicas (default 100): accepted, and
	// the group stalls naming the flag, with no VM cloned or removed.
	kubectlOK(t, "scale", "-n", ns, "vg/web", "--replicas=101")
	kubectlOK(t, "wait", "-n", ns, "vg/web", "--for=condition=Stalled", "--timeout=60s")
	stalled := kubectlOK(t, "get", "-n", ns, "vg/web", "-o", `jsonpath={.status.conditions[?(@.type=="Stalled")].reason}: {.status.conditions[?(@.type=="Stalled")].message}`)
	if !strings.HasPrefix(stalled, "TooManyReplicas: ") || !strings.Contains(stalled, "--vsphere-max-replicas") {
		t.Errorf("Stalled condition %q, want reason TooManyReplicas naming --vsphere-max-replicas", stalled)
	}
	if vms := sim.VMs(t, "/DC0/vm/"+ns+"-web"); len(vms) != 3 {
		t.Errorf("vCenter has %d VMs in the group's folder while stalled, want the 3 it had", len(vms))
	}
	// Back within the limit, the group is Ready again.
	kubectlOK(t, "scale", "-n", ns, "vg/web", "--replicas=3")
	kubectlOK(t, "wait", "-n", ns, "vg/web", "--for=condition=Ready", "--timeout=60s")
	if strings.Contains(mgr.logs.String(), sim.Password) {
		t.Error("the vCenter password appears in the manager's logs")
	}
}
