//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/iam"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const (
	iamCluster   = "e2e"
	iamIssuer    = "https://oidc.example.com/id/E2E"
	iamAccount   = "000000000000"
	readOnlyARN  = "arn:aws:iam::aws:policy/ReadOnlyAccess"
	iamPolicyArn = "arn:aws:iam::" + iamAccount + ":policy/quartermaster/" + iamCluster + "/"
	iamSecretKey = "e2e-not-a-secret"
)

// iamEmulatorProcess is cmd/iam-emulator running as its own process.
type iamEmulatorProcess struct {
	url  string
	cmd  *exec.Cmd
	logs *testenv.LogBuffer
}

var emulatorListening = regexp.MustCompile(`listening on (http://\S+)`)

// iamEmulatorBinary is cmd/iam-emulator, built once per run into binDir.
var iamEmulatorBinary = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(binDir, "iam-emulator")
	return bin, testenv.GoBuild(bin, "./cmd/iam-emulator")
})

// startIAMEmulator runs cmd/iam-emulator on a port the kernel picks, and reads its address from
// the line it logs.
func startIAMEmulator(t *testing.T) *iamEmulatorProcess {
	t.Helper()
	bin, err := iamEmulatorBinary()
	must(t, err)
	e := &iamEmulatorProcess{logs: &testenv.LogBuffer{}}
	e.cmd = exec.Command(bin, "--listen=127.0.0.1:0", "--account-id="+iamAccount, "--eks-clusters="+iamCluster)
	e.cmd.Stdout, e.cmd.Stderr = e.logs, e.logs
	must(t, e.cmd.Start())
	t.Cleanup(func() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		_ = e.cmd.Wait()
		if t.Failed() {
			t.Logf("IAM emulator logs:\n%s", e.logs)
		}
	})
	testenv.PollFor(t, "the IAM emulator to log its address", 50*time.Millisecond, 30*time.Second, func() (bool, string) {
		if m := emulatorListening.FindStringSubmatch(e.logs.String()); m != nil {
			e.url = m[1]
		}
		return e.url != "", e.logs.String()
	})
	return e
}

// noneLeftIn fails t for each role and policy in st whose name has the namespace ns in it: none
// may be left in AWS after what happened.
func noneLeftIn(t *testing.T, st iamemulator.State, ns, after string) {
	t.Helper()
	for _, r := range st.Roles {
		if strings.Contains(r.Name, ns) {
			t.Errorf("role %s is still in AWS after %s", r.Name, after)
		}
	}
	for _, p := range st.Policies {
		if strings.Contains(p.Name, ns) {
			t.Errorf("policy %s is still in AWS after %s", p.Arn, after)
		}
	}
}

// state fetches GET /_emulator/state.
func (e *iamEmulatorProcess) state(t *testing.T) iamemulator.State {
	t.Helper()
	resp, err := http.Get(e.url + iamemulator.StatePath)
	must(t, err)
	defer resp.Body.Close()
	var st iamemulator.State
	must(t, json.NewDecoder(resp.Body).Decode(&st))
	return st
}

// awsEnv points a process's AWS SDK at the emulator through the standard environment variables,
// with credentials of its own and nothing read from the machine's AWS configuration.
func awsEnv(emu *iamEmulatorProcess) []string {
	return []string{
		"AWS_ENDPOINT_URL_IAM=" + emu.url, "AWS_ENDPOINT_URL_STS=" + emu.url, "AWS_ENDPOINT_URL_EKS=" + emu.url, "AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=AKIDE2EEXAMPLE", "AWS_SECRET_ACCESS_KEY=" + iamSecretKey,
		"AWS_EC2_METADATA_DISABLED=true", "AWS_PROFILE=", "AWS_CONFIG_FILE=" + os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull,
	}
}

// startIAMManager runs the manager with only the iam controller, its AWS SDK pointed at the
// emulator (awsEnv).
func startIAMManager(t *testing.T, emu *iamEmulatorProcess, extra ...string) *process {
	t.Helper()
	args := append([]string{"--controllers=iam", "--health-probe-bind-address=0",
		"--cluster-name=" + iamCluster, "--oidc-issuer=" + iamIssuer, "--aws-account-id=" + iamAccount,
		"--allowed-policy-arns=" + readOnlyARN}, extra...)
	return startAs(t, "manager", managerNamespace, "quartermaster-manager", awsEnv(emu), args...)
}

func kubectlApply(t *testing.T, ns, manifest string) {
	t.Helper()
	if out, err := kubectlApplyErr(t, ns, manifest); err != nil {
		t.Fatal(out, err)
	}
}

// kubectlApplyErr applies manifest in ns and returns kubectl's output and error.
func kubectlApplyErr(t *testing.T, ns, manifest string) (string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	must(t, os.WriteFile(path, []byte(manifest), 0o600))
	return cluster.Kubectl(context.Background(), "apply", "-n", ns, "-f", path)
}

func kubectlOK(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cluster.Kubectl(context.Background(), args...)
	if err != nil {
		t.Fatal(out, err)
	}
	return out
}

// waitIAMReady waits with kubectl wait for every object of the kind to be Ready, and shows their
// status and the namespace's Events if they do not become Ready.
func waitIAMReady(t *testing.T, ns, kind string) {
	t.Helper()
	ctx := context.Background()
	if out, err := cluster.Kubectl(ctx, "wait", "-n", ns, kind, "--all", "--for=condition=Ready", "--timeout=120s"); err != nil {
		objects, _ := cluster.Kubectl(ctx, "get", "-n", ns, kind, "-o", "yaml")
		events, _ := cluster.Kubectl(ctx, "get", "-n", ns, "events")
		t.Fatalf("%s: %v\n%s\nevents:\n%s", out, err, objects, events)
	}
}

func findRole(st iamemulator.State, name string) *iamemulator.RoleState {
	for i := range st.Roles {
		if st.Roles[i].Name == name {
			return &st.Roles[i]
		}
	}
	return nil
}

func findPolicy(st iamemulator.State, arn string) *iamemulator.PolicyState {
	for i := range st.Policies {
		if st.Policies[i].Arn == arn {
			return &st.Policies[i]
		}
	}
	return nil
}

// trustSubjects returns the sub values of the trust policy's conditions.
func trustSubjects(t *testing.T, doc string) []string {
	t.Helper()
	var trust struct {
		Statement []struct {
			Principal struct{ Federated string }
			Action    any
			Condition map[string]map[string]any
		}
	}
	if err := json.Unmarshal([]byte(doc), &trust); err != nil {
		t.Fatalf("trust policy %q: %v", doc, err)
	}
	var subs []string
	for _, s := range trust.Statement {
		if !strings.HasSuffix(s.Principal.Federated, ":oidc-provider/oidc.example.com/id/E2E") {
			t.Errorf("trust policy federates %q, want the e2e OIDC provider", s.Principal.Federated)
		}
		for _, keys := range s.Condition {
			for k, v := range keys {
				if strings.HasSuffix(k, ":sub") {
					subs = append(subs, fmt.Sprint(v))
				}
			}
		}
	}
	return subs
}

const iamManifest = `apiVersion: iam.quartermaster.dev/v1alpha1
kind: IAMPolicy
metadata: {name: read-bucket}
spec:
  description: read the e2e bucket
  document:
    Version: "2012-10-17"
    Statement:
    - Effect: Allow
      Action: ["s3:GetObject", "s3:ListBucket"]
      Resource: ["arn:aws:s3:::e2e-bucket", "arn:aws:s3:::e2e-bucket/*"]
---
apiVersion: iam.quartermaster.dev/v1alpha1
kind: IAMPolicy
metadata: {name: write-queue}
spec:
  document:
    Version: "2012-10-17"
    Statement:
    - Effect: Allow
      Action: ["sqs:SendMessage"]
      Resource: ["arn:aws:sqs:us-east-1:000000000000:e2e"]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: app}
---
apiVersion: iam.quartermaster.dev/v1alpha1
kind: IAMServiceAccount
metadata: {name: app}
spec:
  serviceAccountName: app
  policies: [read-bucket, write-queue]
  managedPolicyArns: ["arn:aws:iam::aws:policy/ReadOnlyAccess"]
---
apiVersion: iam.quartermaster.dev/v1alpha1
kind: IAMServiceAccount
metadata: {name: worker}
spec:
  serviceAccountName: worker
  createServiceAccount: true
  policies: [read-bucket]
`

// TestIAMServiceAccountsOnTheLocalCluster runs the manager (as its ServiceAccount, iam controller
// only) against cmd/iam-emulator: IAMPolicies and IAMServiceAccounts become Ready, the roles trust
// exactly their ServiceAccount, the ServiceAccounts carry the role annotation, and deleting the
// namespace removes every object and every AWS object.
func TestIAMServiceAccountsOnTheLocalCluster(t *testing.T) {
	parallel(t, iamController)
	ctx := context.Background()
	emu := startIAMEmulator(t)
	mgr := startIAMManager(t, emu)
	ns := newNamespace(t)
	kubectlApply(t, ns, iamManifest)

	waitIAMReady(t, ns, "iampol")
	waitIAMReady(t, ns, "iamsa")

	readBucket := iamPolicyArn + irsa.PolicyName(ns, "read-bucket")
	writeQueue := iamPolicyArn + irsa.PolicyName(ns, "write-queue")
	wantAttached := map[string][]string{
		"app":    {readBucket, writeQueue, readOnlyARN},
		"worker": {readBucket},
	}

	// Printer columns and short names.
	out := kubectlOK(t, "get", "iamsa", "-n", ns)
	if header := strings.Fields(strings.SplitN(out, "\n", 2)[0]); !slices.Equal(header, []string{"NAME", "READY", "ROLE", "AGE"}) {
		t.Errorf("kubectl get iamsa columns are %v, want NAME READY ROLE AGE:\n%s", header, out)
	}
	for sa := range wantAttached {
		roleARN := "arn:aws:iam::" + iamAccount + ":role/quartermaster/" + iamCluster + "/" + irsa.RoleName(ns, sa)
		if !regexp.MustCompile(`(?m)^` + sa + `\s+True\s+` + regexp.QuoteMeta(roleARN) + `\s`).MatchString(out) {
			t.Errorf("kubectl get iamsa does not show %s Ready with role %s:\n%s", sa, roleARN, out)
		}
	}
	out = kubectlOK(t, "get", "iampol", "-n", ns, "-o", "wide")
	for _, want := range []string{"READY", "ARN", "REASON", readBucket, writeQueue, "Synced"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get iampol -o wide lacks %q:\n%s", want, out)
		}
	}
	out = kubectlOK(t, "get", "iamsa", "-n", ns, "-o", "wide")
	for _, want := range []string{"SERVICEACCOUNT", "REASON", "worker"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get iamsa -o wide lacks %q:\n%s", want, out)
		}
	}
	if out := kubectlOK(t, "get", "quartermaster", "-n", ns); !strings.Contains(out, "iamserviceaccount.iam.quartermaster.dev/app") ||
		!strings.Contains(out, "iampolicy.iam.quartermaster.dev/read-bucket") {
		t.Errorf("kubectl get quartermaster (the category) lacks the IAM objects:\n%s", out)
	}

	// AWS: the policies with their documents, the roles with trust and attachments.
	st := emu.state(t)
	if p := findPolicy(st, readBucket); p == nil || len(p.Versions) != 1 || !strings.Contains(p.Versions[0].Document, "e2e-bucket") {
		t.Errorf("policy %s in AWS: %+v", readBucket, p)
	} else if p.Path != irsa.Path(iamCluster) || p.Description != "read the e2e bucket" {
		t.Errorf("policy %s has path %q and description %q", readBucket, p.Path, p.Description)
	}
	if findPolicy(st, writeQueue) == nil {
		t.Errorf("policy %s is not in AWS", writeQueue)
	}
	for sa, want := range wantAttached {
		role := findRole(st, irsa.RoleName(ns, sa))
		if role == nil {
			t.Errorf("no role for ServiceAccount %s in AWS: %+v", sa, st.Roles)
			continue
		}
		if subs := trustSubjects(t, role.AssumeRolePolicyDocument); !slices.Equal(subs, []string{"system:serviceaccount:" + ns + ":" + sa}) {
			t.Errorf("role %s trusts subjects %v, want only system:serviceaccount:%s:%s", role.Name, subs, ns, sa)
		}
		got := slices.Sorted(slices.Values(role.AttachedPolicies))
		if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("role %s has policies %v attached, want %v", role.Name, got, want)
		}
		// The ServiceAccount points at the role.
		k8sSA := &corev1.ServiceAccount{}
		must(t, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: sa}, k8sSA))
		if got := k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN]; got != role.Arn {
			t.Errorf("ServiceAccount %s is annotated %s=%q, want %q", sa, iamv1alpha1.AnnotationRoleARN, got, role.Arn)
		}
	}
	out = kubectlOK(t, "get", "sa", "worker", "-n", ns, "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}")
	if out != "IAMServiceAccount/worker" {
		t.Errorf("the created ServiceAccount worker is owned by %q, want IAMServiceAccount/worker", out)
	}

	// Deleting the namespace deletes the objects (their finalizers release them once AWS is clean)
	// and then the namespace itself.
	must(t, admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	awaitDeletion(t, "the namespace to be deleted", func() (bool, string) { return namespaceGone(ctx, ns) })
	st = emu.state(t)
	noneLeftIn(t, st, ns, "its namespace was deleted")
	t.Logf("IAM calls by action: %v", st.Calls)
	if strings.Contains(mgr.logs.String(), iamSecretKey) {
		t.Error("the AWS secret key appears in the manager's logs")
	}
}

// TestIAMConfigMapCompat runs the manager with --iam-configmap-compat: a legacy iam-config
// ConfigMap becomes IAMPolicy and IAMServiceAccount objects owned by it, AWS objects, and a Ready
// status annotation; deleting the ConfigMap lets the garbage collector remove the objects, whose
// finalizers remove the AWS objects.
func TestIAMConfigMapCompat(t *testing.T) {
	parallel(t, iamController)
	ctx := context.Background()
	emu := startIAMEmulator(t)
	startIAMManager(t, emu, "--iam-configmap-compat")
	ns := newNamespace(t)
	// Legacy documents: bare strings where the API wants lists.
	kubectlApply(t, ns, `apiVersion: v1
kind: ServiceAccount
metadata: {name: legacy-app}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: iam-config}
data:
  policies.yaml: |
    read-logs:
      Version: "2012-10-17"
      Statement:
        Effect: Allow
        Action: logs:GetLogEvents
        Resource: "*"
    put-metrics:
      Version: "2012-10-17"
      Statement:
      - Effect: Allow
        Action: cloudwatch:PutMetricData
        Resource: "*"
        Condition:
          StringEquals:
            cloudwatch:namespace: e2e
  serviceaccount_attachments.yaml: |
    legacy-app: [read-logs, put-metrics]
`)
	if out, err := cluster.Kubectl(ctx, "wait", "-n", ns, "configmap/iam-config",
		"--for=jsonpath={.metadata.annotations.iam\\.quartermaster\\.dev/status}=Ready", "--timeout=120s"); err != nil {
		msg, _ := cluster.Kubectl(ctx, "get", "-n", ns, "configmap/iam-config", "-o", "yaml")
		t.Fatal(out, err, msg)
	}
	msg := kubectlOK(t, "get", "-n", ns, "configmap/iam-config", "-o", "jsonpath={.metadata.annotations.iam\\.quartermaster\\.dev/message}")
	if !strings.Contains(msg, "3/3 objects Ready") {
		t.Errorf("the ConfigMap's message is %q, want 3/3 objects Ready", msg)
	}
	cm := &corev1.ConfigMap{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: iam.CompatConfigMap}, cm))
	for _, kind := range []string{"iampol/read-logs", "iampol/put-metrics", "iamsa/legacy-app"} {
		out := kubectlOK(t, "get", "-n", ns, kind, "-o", "jsonpath={.metadata.ownerReferences[0].uid} {.status.conditions[?(@.type==\"Ready\")].status}")
		if out != string(cm.UID)+" True" {
			t.Errorf("%s: owner UID and Ready are %q, want %s True", kind, out, cm.UID)
		}
	}
	roleName := irsa.RoleName(ns, "legacy-app")
	st := emu.state(t)
	role := findRole(st, roleName)
	if role == nil {
		t.Fatalf("no role %s in AWS: %+v", roleName, st.Roles)
	}
	want := []string{iamPolicyArn + irsa.PolicyName(ns, "put-metrics"), iamPolicyArn + irsa.PolicyName(ns, "read-logs")}
	if got := slices.Sorted(slices.Values(role.AttachedPolicies)); !slices.Equal(got, want) {
		t.Errorf("role %s has %v attached, want %v", roleName, got, want)
	}
	if subs := trustSubjects(t, role.AssumeRolePolicyDocument); !slices.Equal(subs, []string{"system:serviceaccount:" + ns + ":legacy-app"}) {
		t.Errorf("role %s trusts %v", roleName, subs)
	}
	if p := findPolicy(st, want[1]); p == nil || !strings.Contains(p.Versions[0].Document, "logs:GetLogEvents") {
		t.Errorf("policy read-logs in AWS: %+v", p)
	}
	sa := &corev1.ServiceAccount{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "legacy-app"}, sa))
	if sa.Annotations[iamv1alpha1.AnnotationRoleARN] != role.Arn {
		t.Errorf("ServiceAccount legacy-app annotations: %v", sa.Annotations)
	}

	// Deleting the ConfigMap: the garbage collector deletes its objects, their finalizers the AWS objects.
	must(t, admin.Delete(ctx, cm))
	// admin's scheme has only the built-in kinds.
	c, err := client.New(cluster.Config, client.Options{Scheme: manager.Scheme(iamv1alpha1.AddToScheme)})
	must(t, err)
	eventually(t, "the translated objects to be garbage collected", func() bool {
		pols, sas := &iamv1alpha1.IAMPolicyList{}, &iamv1alpha1.IAMServiceAccountList{}
		return c.List(ctx, pols, client.InNamespace(ns)) == nil && c.List(ctx, sas, client.InNamespace(ns)) == nil &&
			len(pols.Items) == 0 && len(sas.Items) == 0
	})
	noneLeftIn(t, emu.state(t), ns, "the ConfigMap was deleted")
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "legacy-app"}, sa))
	if _, ok := sa.Annotations[iamv1alpha1.AnnotationRoleARN]; ok {
		t.Errorf("the ServiceAccount keeps the role annotation after its role was deleted: %v", sa.Annotations)
	}
}

// TestIAMPodIdentityMigrationOnTheLocalCluster runs the manager as its ServiceAccount under the
// generated RBAC against cmd/iam-emulator (IAM and EKS) and migrates an IAMServiceAccount from IRSA
// through Both to PodIdentity with kubectl, as docs/iam.md's runbook does: the association appears
// with Both while the annotation stays, the annotation goes with PodIdentity, and deleting the
// namespace deletes the association and the role.
func TestIAMPodIdentityMigrationOnTheLocalCluster(t *testing.T) {
	parallel(t, iamController)
	ctx := context.Background()
	emu := startIAMEmulator(t)
	startIAMManager(t, emu)
	ns := newNamespace(t)
	kubectlApply(t, ns, `apiVersion: v1
kind: ServiceAccount
metadata: {name: app}
---
apiVersion: iam.quartermaster.dev/v1alpha1
kind: IAMServiceAccount
metadata: {name: app}
spec:
  serviceAccountName: app
`)
	waitIAMReady(t, ns, "iamsa")
	roleARN := "arn:aws:iam::" + iamAccount + ":role/quartermaster/" + iamCluster + "/" + irsa.RoleName(ns, "app")
	annotation := func() string {
		sa := &corev1.ServiceAccount{}
		must(t, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "app"}, sa))
		return sa.Annotations[iamv1alpha1.AnnotationRoleARN]
	}
	associations := func() []iamemulator.AssociationState {
		var out []iamemulator.AssociationState
		for _, a := range emu.state(t).Associations {
			if a.Namespace == ns {
				out = append(out, a)
			}
		}
		return out
	}
	if got := kubectlOK(t, "get", "iamsa", "app", "-n", ns, "-o", "jsonpath={.spec.mechanism}"); got != "IRSA" || annotation() != roleARN || len(associations()) != 0 {
		t.Fatalf("IRSA: mechanism %q, annotation %q, associations %+v", got, annotation(), associations())
	}

	setMechanism := func(m string) {
		t.Helper()
		kubectlOK(t, "patch", "iamsa", "app", "-n", ns, "--type=merge", "-p", `{"spec":{"mechanism":"`+m+`"}}`)
		// Ready for the new generation: kubectl wait alone could see the old generation's Ready.
		eventually(t, "Ready for "+m, func() bool {
			out, _ := cluster.Kubectl(ctx, "get", "iamsa", "app", "-n", ns, "-o",
				`jsonpath={.metadata.generation}/{.status.conditions[?(@.type=="Ready")].observedGeneration}/{.status.conditions[?(@.type=="Ready")].status}`)
			parts := strings.Split(out, "/")
			return len(parts) == 3 && parts[0] == parts[1] && parts[2] == "True"
		})
	}
	setMechanism("Both")
	a := associations()
	if len(a) != 1 || a[0].Cluster != iamCluster || a[0].ServiceAccount != "app" || a[0].RoleArn != roleARN || annotation() != roleARN {
		t.Fatalf("Both: associations %+v, annotation %q", a, annotation())
	}
	if out := kubectlOK(t, "get", "iamsa", "app", "-n", ns, "-o", "wide"); !strings.Contains(out, "MECHANISM") || !strings.Contains(out, "Both") || !strings.Contains(out, a[0].ID) {
		t.Errorf("kubectl get -o wide does not show the mechanism and the association:\n%s", out)
	}
	setMechanism("PodIdentity")
	if b := associations(); len(b) != 1 || b[0].ID != a[0].ID || annotation() != "" {
		t.Fatalf("PodIdentity: associations %+v (was %s), annotation %q", b, a[0].ID, annotation())
	}
	if role := findRole(emu.state(t), irsa.RoleName(ns, "app")); role == nil || strings.Contains(role.AssumeRolePolicyDocument, "AssumeRoleWithWebIdentity") ||
		!strings.Contains(role.AssumeRolePolicyDocument, "pods.eks.amazonaws.com") {
		t.Errorf("PodIdentity: role %+v, want it trusting pods.eks.amazonaws.com only", role)
	}

	must(t, admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	awaitDeletion(t, "the namespace to be deleted", func() (bool, string) { return namespaceGone(ctx, ns) })
	if left := associations(); len(left) != 0 || findRole(emu.state(t), irsa.RoleName(ns, "app")) != nil {
		t.Errorf("left in AWS after the namespace was deleted: associations %+v", left)
	}
	t.Logf("calls by operation: %v", emu.state(t).Calls)
}
