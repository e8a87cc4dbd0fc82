//go:build e2e

package realnode

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/chart"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestIAMAndVmGroupsFromTheManagerPod: the emulators of AWS IAM (with STS and EKS) and of vCenter
// run where AWS and vCenter would be for a cluster, outside it (on the host, reached through the
// node's link); the chart is upgraded to switch on the iam and vmgroups controllers, as a platform
// admin would, with the credentials in Secrets. The manager's Pods then serve an IAMServiceAccount
// (its role made in IAM, its ServiceAccount annotated) and a VmGroup, which kubectl scale grows
// from 1 to 3 VMs in vCenter. The chart goes back to its first values at the end.
func TestIAMAndVmGroupsFromTheManagerPod(t *testing.T) {
	ctx := context.Background()
	const account, eksCluster, template = "000000000000", "real", "ubuntu-22.04-template"
	emu := iamemulator.New(iamemulator.Options{AccountID: account, EKSClusters: []string{eksCluster}})
	ln, err := net.Listen("tcp", net.JoinHostPort(cluster.HostIP, "0"))
	must(t, err)
	srv := &http.Server{Handler: emu, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	emuURL := "http://" + ln.Addr().String()
	sim := vsimtest.StartOn(t, cluster.HostIP)
	sim.AddTemplate(t, template)

	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: releaseNamespace, Name: "vcenter"},
			StringData: map[string]string{"VC_HOST": sim.URL.String(), "VC_USER": sim.User, "VC_PASS": sim.Password}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: releaseNamespace, Name: "aws-credentials"},
			StringData: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDREALNODEEXAMPLE", "AWS_SECRET_ACCESS_KEY": "real-node-secret-key"}},
	} {
		must(t, admin.Create(ctx, s))
		t.Cleanup(func() { _ = admin.Delete(ctx, s) })
	}
	upgrade(t, "--reuse-values",
		"--set", "vmgroups.enabled=true", "--set", "vmgroups.vcenterSecret=vcenter", "--set", "vmgroups.insecure=true",
		"--set", "iam.enabled=true", "--set", "iam.clusterName="+eksCluster, "--set", "iam.oidcIssuer=https://oidc.example.com/id/REAL",
		"--set", "iam.awsAccountId="+account, "--set", "iam.allowedPolicyArns={arn:aws:iam::aws:policy/ReadOnlyAccess}",
		"--set", "iam.aws.region=us-east-1", "--set", "iam.aws.iamEndpoint="+emuURL, "--set", "iam.aws.stsEndpoint="+emuURL,
		"--set", "iam.aws.eksEndpoint="+emuURL, "--set", "iam.aws.credentialsSecret=aws-credentials")
	// Back to the first values once the objects are gone (cleanups run last first).
	t.Cleanup(func() { upgrade(t, "-f", valuesFile) })

	ns := newNamespace(t, "real-cloud")
	isa := &iamv1alpha1.IAMServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reports"},
		Spec: iamv1alpha1.IAMServiceAccountSpec{
			ServiceAccountName: "reports", CreateServiceAccount: true,
			ManagedPolicyArns: []string{"arn:aws:iam::aws:policy/ReadOnlyAccess"},
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

// upgrade runs helm upgrade of the release with args and waits for its workloads.
func upgrade(t *testing.T, args ...string) {
	t.Helper()
	out, err := testenv.Helm4.Run(append([]string{"upgrade", release, chart.Dir, "--namespace", releaseNamespace,
		"--kubeconfig", cluster.Kubeconfig, "--wait", "--timeout", "3m"}, args...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := stuckPods(context.Background(), releaseNamespace); err != nil {
		t.Fatal(err)
	}
}
