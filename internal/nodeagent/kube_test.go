package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// The agent against a real API server (envtest with the project's RegistryMirror CRD), as the
// user "node-agent" holding exactly the RBAC the agent's ServiceAccount gets.

const agentNamespace = "quartermaster-system"

type apiFixture struct {
	env   *testenv.Env
	c     client.Client
	agent *rest.Config // as "node-agent"
}

func TestAgentWithAPIServer(t *testing.T) {
	env := testenv.Start(t)
	f := &apiFixture{env: env, c: env.Client}
	mustCreate(t, f.c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}})
	for _, obj := range agentRBAC("node-agent", agentNamespace) {
		mustCreate(t, f.c, obj)
	}
	f.agent = restConfigFor(t, env, "node-agent")

	t.Run("reports on its Pod only when the state changes", f.testReports)
	t.Run("keeps the file at shutdown while the mirror exists", f.testKeepsWhileMirrorExists)
	t.Run("removes the file when the mirror is being deleted", f.testRemovesWhenDeleting)
	t.Run("removes the file when the mirror is gone", f.testRemovesWhenGone)
	t.Run("removes the file when the mirror is refused for the host", f.testRemovesWhenDuplicate)
	t.Run("removes the file when the mirror serves another host", f.testRemovesWhenMoved)
	t.Run("takes over the file of a deleted mirror", f.testTakesOverDeletedMirrorsFile)
	t.Run("takes over the file of a mirror refused for the host", f.testTakesOverDuplicateMirrorsFile)
	t.Run("keeps the file when the API server cannot say", f.testKeepsWhenUnsure)
	t.Run("runs: probes, restores, keeps the file at exit", f.testRun)
	t.Run("runs: a failed report is retried before the next check", f.testRunRetriesReport)
}

// agentRBAC is the agent's RBAC for a user named user, as the DaemonSet's ServiceAccount gets it.
func agentRBAC(user, namespace string) []client.Object {
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	return []client.Object{
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "test-node-agent"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"registry.quartermaster.dev"}, Resources: []string{"registrymirrors"}, Verbs: []string{"get"}}},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "test-node-agent"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "test-node-agent"},
			Subjects:   subject,
		},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "test-node-agent", Namespace: namespace},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"patch"}}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "test-node-agent", Namespace: namespace},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "test-node-agent"},
			Subjects:   subject,
		},
	}
}

func restConfigFor(t *testing.T, env *testenv.Env, user string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", env.KubeconfigFor(t, user))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func mustCreate(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

// pod creates the agent's Pod (no kubelet runs it) and returns the agent's access as that Pod.
func (f *apiFixture) pod(t *testing.T, name string) *Kube {
	t.Helper()
	mustCreate(t, f.c, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: agentNamespace},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "quartermaster:dev"}}},
	})
	kube, err := NewKube(f.agent, name, agentNamespace)
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

// registryMirror creates a RegistryMirror, held by a finalizer when hold is set.
func (f *apiFixture) registryMirror(t *testing.T, name string, hold bool) *unstructured.Unstructured {
	t.Helper()
	rm := &unstructured.Unstructured{}
	rm.SetAPIVersion(MirrorResource.GroupVersion().String())
	rm.SetKind("RegistryMirror")
	rm.SetName(name)
	if hold {
		rm.SetFinalizers([]string{"test.quartermaster.dev/hold"})
	}
	if err := unstructured.SetNestedField(rm.Object, testUpstream, "spec", "upstreamUrl"); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, f.c, rm)
	t.Cleanup(func() {
		ctx := context.Background()
		if hold {
			if err := f.c.Patch(ctx, rm, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`))); err != nil && !apierrors.IsNotFound(err) {
				t.Error(err)
			}
		}
		if err := f.c.Delete(ctx, rm); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})
	return rm
}

// setStatus writes the mirror's status.mirrorHost (when not "") and a Ready condition with reason
// through the status subresource, as the controller does.
func (f *apiFixture) setStatus(t *testing.T, rm *unstructured.Unstructured, mirrorHost, readyReason string) {
	t.Helper()
	status := map[string]any{
		"conditions": []any{map[string]any{
			"type": registryv1alpha1.ConditionReady, "status": "False", "reason": readyReason,
			"message": "set by the test", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
		}},
	}
	if mirrorHost != "" {
		status["mirrorHost"] = mirrorHost
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.c.Status().Patch(context.Background(), rm, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

func (f *apiFixture) podAnnotations(t *testing.T, name string) (map[string]string, string) {
	t.Helper()
	pod := &corev1.Pod{}
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: agentNamespace, Name: name}, pod); err != nil {
		t.Fatal(err)
	}
	return pod.Annotations, pod.ResourceVersion
}

func (f *apiFixture) testReports(t *testing.T) {
	ctx := context.Background()
	f.registryMirror(t, "hub", false)
	kube := f.pod(t, "agent-reports")
	root := writeNode(t, nil)
	a := newAgent(t, root, kube)

	st := a.Sync(ctx)
	got, rv := f.podAnnotations(t, "agent-reports")
	want := map[string]string{
		AnnotationHostsDir:   "/etc/containerd/certs.d",
		AnnotationConfigured: "true",
		AnnotationReason:     ReasonConfigured,
		AnnotationMessage:    st.Message,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("Pod annotations %v, want %v", got, want)
	}

	a.Sync(ctx)
	a.Sync(ctx)
	if _, rv2 := f.podAnnotations(t, "agent-reports"); rv2 != rv {
		t.Errorf("the Pod was written at steady state (resourceVersion %s → %s)", rv, rv2)
	}

	if err := os.WriteFile(filepath.Join(root, hubFile), []byte("server = \"https://x\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.Sync(ctx)
	got, _ = f.podAnnotations(t, "agent-reports")
	if got[AnnotationConfigured] != "false" || got[AnnotationReason] != ReasonConflict || got[AnnotationHostsDir] != "/etc/containerd/certs.d" {
		t.Errorf("Pod annotations %v, want a conflict reported", got)
	}
}

func (f *apiFixture) testKeepsWhileMirrorExists(t *testing.T) {
	f.registryMirror(t, "kept", false)
	root := writeNode(t, nil)
	a := newAgentOf(t, root, f.pod(t, "agent-kept"), "kept", "docker.io")
	a.Sync(context.Background())
	a.Shutdown(context.Background())
	if got := readNode(t, root, hubFile); got != string(wantContent("kept")) {
		t.Errorf("after a shutdown with the mirror in place, hosts.toml is:\n%s", got)
	}
}

func (f *apiFixture) testRemovesWhenDeleting(t *testing.T) {
	ctx := context.Background()
	rm := f.registryMirror(t, "deleting", true)
	root := writeNode(t, nil)
	a := newAgentOf(t, root, f.pod(t, "agent-deleting"), "deleting", "docker.io")
	a.Sync(ctx)
	if err := f.c.Delete(ctx, rm); err != nil {
		t.Fatal(err)
	}
	a.Shutdown(ctx)
	if _, err := os.Stat(filepath.Join(root, filepath.Dir(hubFile))); !os.IsNotExist(err) {
		t.Errorf("the mirror host's directory is still there (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(root, "/etc/containerd/certs.d")); err != nil {
		t.Errorf("containerd's hosts directory went too: %v", err)
	}
}

func (f *apiFixture) testRemovesWhenGone(t *testing.T) {
	ctx := context.Background()
	// Never created: NotFound. A certificate someone put next to the file keeps the directory.
	root := writeNode(t, map[string]string{"/etc/containerd/certs.d/docker.io/ca.crt": "x"})
	a := newAgentOf(t, root, f.pod(t, "agent-gone"), "gone", "docker.io")
	wantStatus(t, a.Sync(ctx), true, ReasonConfigured, "/etc/containerd/certs.d")
	a.Shutdown(ctx)
	if _, err := os.Stat(filepath.Join(root, hubFile)); !os.IsNotExist(err) {
		t.Errorf("hosts.toml is still there (%v)", err)
	}
	if got := readNode(t, root, "/etc/containerd/certs.d/docker.io/ca.crt"); got != "x" {
		t.Errorf("ca.crt changed: %q", got)
	}
}

func (f *apiFixture) testTakesOverDeletedMirrorsFile(t *testing.T) {
	ctx := context.Background()
	// "old" does not exist: its leftover file is the agent's to replace.
	root := writeNode(t, map[string]string{hubFile: string(wantContent("old"))})
	a := newAgentOf(t, root, f.pod(t, "agent-takeover"), "new", "docker.io")
	wantStatus(t, a.Sync(ctx), true, ReasonConfigured, "/etc/containerd/certs.d")
	if got := readNode(t, root, hubFile); got != string(wantContent("new")) {
		t.Errorf("hosts.toml is:\n%s", got)
	}

	// "live" exists: its file stays.
	f.registryMirror(t, "live", false)
	root = writeNode(t, map[string]string{hubFile: string(wantContent("live"))})
	a = newAgentOf(t, root, a.cfg.Kube, "new", "docker.io")
	wantStatus(t, a.Sync(ctx), false, ReasonConflict, "/etc/containerd/certs.d")
	if got := readNode(t, root, hubFile); got != string(wantContent("live")) {
		t.Errorf("the live mirror's hosts.toml was changed:\n%s", got)
	}
}

// The controller marks the younger of two mirrors of one host DuplicateMirrorHost before it
// deletes that mirror's agents: they remove their files, so the older mirror's agents can write.
func (f *apiFixture) testRemovesWhenDuplicate(t *testing.T) {
	ctx := context.Background()
	rm := f.registryMirror(t, "refused", false)
	root := writeNode(t, nil)
	a := newAgentOf(t, root, f.pod(t, "agent-refused"), "refused", "docker.io")
	wantStatus(t, a.Sync(ctx), true, ReasonConfigured, "/etc/containerd/certs.d")
	f.setStatus(t, rm, "docker.io", registryv1alpha1.ReasonDuplicateMirrorHost)
	a.Shutdown(ctx)
	if _, err := os.Stat(filepath.Join(root, filepath.Dir(hubFile))); !os.IsNotExist(err) {
		t.Errorf("the mirror host's directory is still there (%v)", err)
	}
}

// status.mirrorHost names the host the mirror serves: an agent of another host releases its file,
// an agent of that host (with any other Ready reason) keeps it.
func (f *apiFixture) testRemovesWhenMoved(t *testing.T) {
	ctx := context.Background()
	rm := f.registryMirror(t, "moved", false)
	root := writeNode(t, nil)
	a := newAgentOf(t, root, f.pod(t, "agent-moved"), "moved", "docker.io")
	wantStatus(t, a.Sync(ctx), true, ReasonConfigured, "/etc/containerd/certs.d")

	f.setStatus(t, rm, "docker.io", "CacheUnavailable")
	a.Shutdown(ctx)
	if got := readNode(t, root, hubFile); got != string(wantContent("moved")) {
		t.Fatalf("after a shutdown with the mirror serving docker.io, hosts.toml is:\n%s", got)
	}

	f.setStatus(t, rm, "quay.io", "CacheUnavailable")
	a.Shutdown(ctx)
	if _, err := os.Stat(filepath.Join(root, hubFile)); !os.IsNotExist(err) {
		t.Errorf("hosts.toml is still there with the mirror serving quay.io (%v)", err)
	}
}

func (f *apiFixture) testTakesOverDuplicateMirrorsFile(t *testing.T) {
	ctx := context.Background()
	f.setStatus(t, f.registryMirror(t, "younger", false), "docker.io", registryv1alpha1.ReasonDuplicateMirrorHost)
	root := writeNode(t, map[string]string{hubFile: string(wantContent("younger"))})
	a := newAgentOf(t, root, f.pod(t, "agent-older"), "older", "docker.io")
	wantStatus(t, a.Sync(ctx), true, ReasonConfigured, "/etc/containerd/certs.d")
	if got := readNode(t, root, hubFile); got != string(wantContent("older")) {
		t.Errorf("hosts.toml is:\n%s", got)
	}
}

// Unreachable or forbidden: the agent cannot tell the mirror is deleted, so the file stays (a
// mirror that is gone only costs containerd a failed dial before the upstream).
func (f *apiFixture) testKeepsWhenUnsure(t *testing.T) {
	ctx := context.Background()
	unreachable := rest.CopyConfig(f.agent)
	unreachable.Host = "https://" + closedAddr(t)
	forbidden := restConfigFor(t, f.env, "someone-else")
	for name, cfg := range map[string]*rest.Config{"unreachable": unreachable, "forbidden": forbidden} {
		t.Run(name, func(t *testing.T) {
			kube, err := NewKube(cfg, "agent-unsure", agentNamespace)
			if err != nil {
				t.Fatal(err)
			}
			root := writeNode(t, nil)
			a := newAgentOf(t, root, nil, "unsure", "docker.io") // write without reporting
			a.Sync(ctx)
			a.cfg.Kube = kube
			a.Shutdown(ctx)
			if got := readNode(t, root, hubFile); got != string(wantContent("unsure")) {
				t.Errorf("hosts.toml is:\n%s", got)
			}
		})
	}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func (f *apiFixture) testRun(t *testing.T) {
	f.registryMirror(t, "running", false)
	root := writeNode(t, nil)
	a, err := New(Config{Mirror: "running", MirrorHost: "docker.io", Endpoint: testEndpoint, Upstream: testUpstream,
		Root: root, Kube: f.pod(t, "agent-running"), Resync: 50 * time.Millisecond, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	probes, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	readyz := "http://" + probes.Addr().String() + "/readyz"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, probes) }()
	var runErr error
	stopped := false
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			runErr = <-done
		}
		return runErr
	}
	t.Cleanup(func() { _ = stop() })

	testenv.PollFor(t, "/readyz to answer 200", 20*time.Millisecond, 30*time.Second, func() (bool, string) {
		code := get(readyz)
		return code == http.StatusOK, fmt.Sprintf("last status %d", code)
	})
	if err := os.Remove(filepath.Join(root, hubFile)); err != nil {
		t.Fatal(err)
	}
	testenv.PollFor(t, "hosts.toml to be restored", 20*time.Millisecond, 30*time.Second, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(root, hubFile))
		if err != nil {
			return false, err.Error()
		}
		return string(b) == string(wantContent("running")), "hosts.toml:\n" + string(b)
	})

	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if got := readNode(t, root, hubFile); got != string(wantContent("running")) {
		t.Errorf("after Run returned with the mirror in place, hosts.toml is:\n%s", got)
	}
	if code := get(readyz); code != 0 {
		t.Errorf("the probes still answer (%d) after Run returned", code)
	}
}

// An agent whose first report fails (its Pod is not there yet) reports again soon, not only at the
// next check: with an hour between checks, only the retry can put the annotations on the Pod.
func (f *apiFixture) testRunRetriesReport(t *testing.T) {
	f.registryMirror(t, "retried", false)
	reportFailed, failed := make(chan struct{}), sync.Once{}
	kube, err := NewKube(f.agent, "agent-retried", agentNamespace)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Mirror: "retried", MirrorHost: "docker.io", Endpoint: testEndpoint, Upstream: testUpstream,
		Root: writeNode(t, nil), Kube: kube, Resync: time.Hour, Log: funcr.New(func(prefix, args string) {
			t.Log(prefix, args)
			if strings.Contains(args, "annotating the agent's Pod; retrying") {
				failed.Do(func() { close(reportFailed) })
			}
		}, funcr.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-reportFailed:
	case <-time.After(30 * time.Second):
		t.Fatal("the first report on the missing Pod did not fail")
	}
	f.pod(t, "agent-retried")
	testenv.PollFor(t, "the agent's report on its Pod", 100*time.Millisecond, 30*time.Second, func() (bool, string) {
		ann, _ := f.podAnnotations(t, "agent-retried")
		return ann[AnnotationConfigured] == "true" && ann[AnnotationReason] == ReasonConfigured, fmt.Sprint(ann)
	})
}

// get returns a GET's status code, 0 when it fails.
func get(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Only Ready's reason and status.mirrorHost count; a mirror not reconciled yet serves its host.
func TestMirrorState(t *testing.T) {
	ready := func(reason string) map[string]any {
		return map[string]any{"type": "Ready", "status": "False", "reason": reason}
	}
	for _, tc := range []struct {
		name     string
		deleting bool
		status   map[string]any
		want     MirrorState
	}{
		{name: "no status", want: MirrorServes},
		{name: "same host, other reason", status: map[string]any{"mirrorHost": "docker.io", "conditions": []any{ready("CacheUnavailable")}}, want: MirrorServes},
		{name: "duplicate", status: map[string]any{"mirrorHost": "docker.io", "conditions": []any{ready(registryv1alpha1.ReasonDuplicateMirrorHost)}}, want: MirrorDuplicate},
		{name: "duplicate on another condition", status: map[string]any{"conditions": []any{
			map[string]any{"type": "Stalled", "status": "True", "reason": registryv1alpha1.ReasonDuplicateMirrorHost}, ready("Reconciling")}}, want: MirrorServes},
		{name: "another host", status: map[string]any{"mirrorHost": "quay.io"}, want: MirrorMoved},
		{name: "deleting", deleting: true, status: map[string]any{"mirrorHost": "docker.io"}, want: MirrorDeleting},
		{name: "malformed", status: map[string]any{"mirrorHost": 3, "conditions": []any{"Ready"}}, want: MirrorServes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &unstructured.Unstructured{Object: map[string]any{}}
			m.SetName("m")
			if tc.deleting {
				m.SetDeletionTimestamp(ptr.To(metav1.Now()))
			}
			if tc.status != nil {
				m.Object["status"] = tc.status
			}
			if got := mirrorState(m, "docker.io"); got != tc.want {
				t.Errorf("mirrorState = %v, want %v", got, tc.want)
			}
		})
	}
}
