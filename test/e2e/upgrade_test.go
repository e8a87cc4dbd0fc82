//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/chart"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// The upgraded release: names of its own, so nothing collides with config/local's or the chart test's.
const (
	upRelease   = "qm-up"
	upNamespace = "qm-up-system"
	upRequests  = "qm-up-requests"
	upMirrors   = "qm-up-mirrors"
	upPrefix    = "qm-up-"
)

// TestHelmUpgradeAndRollbackLoseNothing installs the chart as the earlier release
// (hack/earlier-release, the newest commit that landed) released it, its CRDs included, and runs that commit's manager (built from its
// sources) as the Deployment's pods say; creates an object of every kind; then, while a load generator keeps
// creating namespace requests and IAMServiceAccounts and scaling a VmGroup, upgrades the release to
// this commit's chart and rolls it back with Helm 3 (as most clusters are managed; it installed the
// release too), then does both again with Helm 4 (a team moving to Helm 4). The Deployment
// rolls: each pod's manager starts when its pod appears and gets SIGTERM when its pod goes, so the
// old and the new manager overlap and leader election hands over. After each step nothing is lost:
// every object Ready and none Stalled, every request's Namespace and Secret written once, one IAM
// role per IAMServiceAccount created once, each VM cloned once and none removed, and the objects
// stored before the upgrade read back with the spec they were stored with, the CRDs' stored
// versions unchanged. The longest time an
// object created during a rollout waited to be served is logged (never asserted).
func TestHelmUpgradeAndRollbackLoseNothing(t *testing.T) {
	alone(t)
	ctx := context.Background()
	h := testenv.Helm3 // installs; the rollouts name theirs
	began := time.Now()
	prev := previousRelease(t)
	t.Logf("the earlier release: commit %s (hack/earlier-release), extracted and built in %s",
		prev.commit, time.Since(began).Round(time.Second))
	oldTag, newTag := "old-"+prev.commit[:12], "new"
	sim := vsimtest.Start(t)
	sim.AddTemplate(t, "ubuntu-22.04-template")
	emu := startIAMEmulator(t)
	upstream := newOpenRegistry(t)
	installKubeArmorCRD(t) // so an intent is Ready (in force) rather than waiting for an engine

	values := map[string]any{
		"fullnameOverride": upRelease,
		"image":            map[string]any{"repository": "registry.example.com/quartermaster", "tag": oldTag},
		"leaderElection":   map[string]any{"id": "qm-up-" + strings.ToLower(time.Now().Format("150405.000000"))},
		"crdPollInterval":  "5s",
		"namespaces":       map[string]any{"requestsNamespace": upRequests},
		"vmgroups":         map[string]any{"enabled": true, "vcenterSecret": "vcenter", "insecure": true},
		"iam": map[string]any{
			"enabled": true, "clusterName": iamCluster, "oidcIssuer": iamIssuer, "awsAccountId": iamAccount,
			"allowedPolicyArns": []any{readOnlyARN},
			"aws":               map[string]any{"region": "us-east-1", "iamEndpoint": emu.url, "stsEndpoint": emu.url, "credentialsSecret": "aws-credentials"},
		},
		"mirrors": map[string]any{"namespace": upMirrors},
	}
	valuesFile := filepath.Join(t.TempDir(), "values.yaml")
	data, err := yaml.Marshal(values)
	must(t, err)
	must(t, os.WriteFile(valuesFile, data, 0o600))
	helm := func(args ...string) {
		t.Helper()
		if out, err := h.Run(append(args, "--namespace", upNamespace, "--kubeconfig", cluster.Kubeconfig)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}

	// The CRDs are the release's (crds.enabled, the default): each install, upgrade and rollback
	// applies its chart's. config/local installed them with kubectl; the release adopts them, as
	// Helm adopts objects that carry its ownership metadata. Afterwards they are config/local's again.
	// A kind this commit adds (its CRD installed by config/local too) is adopted the same way.
	crds := adoptCRDs(t, h, filepath.Join(prev.dir, chart.Dir), filepath.Join(testenv.RepoRoot(), chart.Dir))
	helm("install", upRelease, filepath.Join(prev.dir, chart.Dir), "--create-namespace", "-f", valuesFile, "--wait", "--timeout", "3m")
	t.Cleanup(func() {
		_, _ = h.Run("uninstall", upRelease, "--namespace", upNamespace, "--kubeconfig", cluster.Kubeconfig, "--wait")
		for _, ns := range []string{upNamespace, upRequests, upMirrors} {
			_ = admin.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		}
	})
	must(t, waitForPolicies(ctx, upNamespace, upRelease+"-manager", upRelease, upMirrors))
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: upNamespace, Name: "vcenter"},
			StringData: map[string]string{"VC_HOST": sim.URL.String(), "VC_USER": sim.User, "VC_PASS": sim.Password}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: upNamespace, Name: "aws-credentials"},
			StringData: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDE2EEXAMPLE", "AWS_SECRET_ACCESS_KEY": iamSecretKey}},
	} {
		must(t, admin.Create(ctx, s))
	}

	// Every write that must happen once, watched from before the first manager starts.
	cs, err := kubernetes.NewForConfig(cluster.Config)
	must(t, err)
	writes := watchRequestWrites(t, cs, upRequests, upPrefix)
	served := newFirstSeen()
	requests, err := cs.CoreV1().ConfigMaps(upRequests).Watch(ctx, metav1.ListOptions{})
	must(t, err)
	t.Cleanup(requests.Stop)
	go served.follow(requests, func(o client.Object) bool {
		return o.GetAnnotations()[nsrequest.AnnotationStatus] == string(nsrequest.StatusReady)
	})

	pods := newPodRunner(t, map[string]string{oldTag: prev.bin, newTag: managerBin})
	pods.sync(ctx)
	if pods.running() != 2 {
		t.Fatalf("%d managers run for the release's pods, want 2", pods.running())
	}

	// An object of every kind, served by the earlier release.
	ns := newNamespace(t)
	var stored []*unstructured.Unstructured // what must read back unchanged
	create := func(o *unstructured.Unstructured) {
		t.Helper()
		must(t, admin.Create(ctx, o))
		t.Cleanup(func() { _ = admin.Delete(context.Background(), o) })
		stored = append(stored, o)
	}
	// Objects of earlier tests may still be waiting for their finalizers, and this release's managers
	// serve them too: every check below looks at this test's objects only, named so nothing else is.
	web := sample(t, "vmgroups/vmgroup.yaml")[0]
	web.SetName(upPrefix + "web")
	for _, o := range append(append([]*unstructured.Unstructured{web}, sample(t, "iam/policy.yaml")...), sample(t, "iam/serviceaccount.yaml")...) {
		o.SetNamespace(ns)
		create(o)
	}
	busy := sample(t, "vmgroups/vmgroup.yaml")[0] // the VmGroup the load scales
	busy.SetName(upPrefix + "busy")
	busy.SetNamespace(ns)
	must(t, unstructured.SetNestedField(busy.Object, int64(1), "spec", "replicas"))
	must(t, admin.Create(ctx, busy))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), busy) })
	rmName := upPrefix + "docker-hub"
	// Reserved for the cache pod's claim: no other claim left unbound may take it.
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "qm-up-mirror"},
		Spec: corev1.PersistentVolumeSpec{
			ClaimRef:                      &corev1.ObjectReference{Namespace: upMirrors, Name: mirror.PVCName(rmName, 0)},
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/qm-up-mirror"}},
		},
	}
	must(t, admin.Create(ctx, pv))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), pv) })
	rm := sample(t, "registry/docker-hub.yaml")[0]
	rm.SetName(rmName)
	must(t, unstructured.SetNestedField(rm.Object, upstream, "spec", "upstreamUrl"))
	unstructured.RemoveNestedField(rm.Object, "spec", "credentialsSecret")
	must(t, unstructured.SetNestedField(rm.Object, int64(1), "spec", "replicas"))
	must(t, unstructured.SetNestedMap(rm.Object, map[string]any{"size": "1Gi", "storageClassName": ""}, "spec", "storage"))
	create(rm)
	for _, o := range sample(t, "intents/dns-manipulation.yaml") {
		if o.GetKind() == "SecurityIntent" {
			o.SetName(upPrefix + "dns-manipulation")
		} else {
			o.SetNamespace(ns)
			must(t, unstructured.SetNestedField(o.Object, []any{map[string]any{"name": upPrefix + "dns-manipulation"}}, "spec", "intents"))
		}
		create(o)
	}
	iamIDs := map[string]string{} // IAM name -> ID: a role or policy created again gets a new ID
	load := &loadGenerator{ns: ns, busy: busy.GetName(), served: served, replicas: 1}
	for range 10 {
		load.request(t)
	}

	converged := func(phase string) {
		t.Helper()
		pods.waitFor(ctx, phase+": every IAMPolicy, IAMServiceAccount and VmGroup Ready", func() bool {
			out, err := cluster.Kubectl(ctx, "get", "-n", ns, "iampolicy,iamsa,vg", "-o", `jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}`)
			return err == nil && !strings.Contains(out, "False") && strings.Count(out, "True") == 3+load.roles+1
		})
		pods.waitFor(ctx, phase+": VmGroup busy's VMs ready", func() bool {
			vg := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "compute.quartermaster.dev/v1alpha1", "kind": "VmGroup"}}
			if admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: busy.GetName()}, vg) != nil {
				return false
			}
			ready, _, _ := unstructured.NestedInt64(vg.Object, "status", "readyReplicas")
			return ready == load.replicas
		})
		for _, o := range []string{"rm/" + rm.GetName(), "si/" + upPrefix + "dns-manipulation"} {
			waitConditionReady(t, "", o, pods.last())
		}
		waitConditionReady(t, ns, "sib/dns-manipulation-binding", pods.last())
		for _, name := range load.names {
			pods.waitFor(ctx, "request "+name+" to be Ready", func() bool { return served.has(name) })
		}
		t.Logf("%s: %d requests, %d IAMServiceAccounts, VmGroup busy at %d replicas, all Ready", phase, len(load.names), load.roles+1, load.replicas)
		nothingLost(t, phase, ns, writes, load, emu, sim, iamIDs)
	}
	began = time.Now()
	converged("installed (the earlier release)")
	t.Logf("the earlier release served everything in %s", time.Since(began).Round(time.Second))
	snapshot := readBack(t, stored)
	versions := storedVersions(t, crds)

	// A rollout under load: the load generator runs while helm upgrades (or rolls back) and the
	// pods' managers follow the pods, until the Deployment has rolled and its managers run.
	rollout := func(h testenv.Helm, phase string, args ...string) {
		t.Helper()
		phase = fmt.Sprintf("%s (%s)", phase, h)
		load.begin()
		if args[0] == "rollback" {
			pods.rollingBack(newTag)
		}
		done := make(chan error, 1)
		go func() {
			out, err := h.Run(append(args, "--namespace", upNamespace, "--kubeconfig", cluster.Kubeconfig, "--wait", "--timeout", "3m")...)
			if err != nil {
				err = fmt.Errorf("%w\n%s", err, out)
			}
			done <- err
		}()
		var helmErr error
		helmDone := false
		pods.waitFor(ctx, phase+": helm to finish and the Deployment's managers to run", func() bool {
			if !helmDone {
				select {
				case helmErr = <-done:
					helmDone = true
				default:
				}
			}
			load.tick(t)
			return helmDone && pods.settled(ctx)
		})
		must(t, helmErr)
		converged(phase)
		t.Logf("%s in %s: %d managers started so far; the longest wait of an object created during the rollout: %s (%s)",
			phase, time.Since(load.since).Round(time.Second), pods.started, load.longest().Round(time.Millisecond), load.longestWhat)
		if !equality.Semantic.DeepEqual(readBack(t, stored), snapshot) {
			t.Errorf("%s: the objects stored before the upgrade read back changed:\nbefore: %v\nafter:  %v", phase, snapshot, readBack(t, stored))
		}
		if now := storedVersions(t, crds); !equality.Semantic.DeepEqual(now, versions) {
			t.Errorf("%s: the CRDs' stored versions are %v, were %v (a storage version migration is due: docs/api-versions.md)", phase, now, versions)
		}
	}
	// Helm 4 then upgrades and rolls back the release Helm 3 wrote, as a team moving to Helm 4 would.
	upgrade := []string{"upgrade", upRelease, chart.Dir, "-f", valuesFile, "--set", "image.tag=" + newTag}
	rollout(testenv.Helm3, "upgraded to this commit", upgrade...)
	rollout(testenv.Helm3, "rolled back", "rollback", upRelease)
	rollout(testenv.Helm4, "upgraded to this commit again", upgrade...)
	rollout(testenv.Helm4, "rolled back again", "rollback", upRelease)
	// While the release's managers run: its objects' finalizers are theirs.
	deleteNamespace(t, ns)
}

// release is an earlier commit's chart and manager binary.
type release struct{ commit, dir, bin string }

// previousRelease is the earlier release (testenv.EarlierRelease) with its manager built from its
// tree, once per commit (testenv.EarlierReleaseBuild keeps it in the cache).
func previousRelease(t *testing.T) release {
	t.Helper()
	r := release{}
	r.commit, r.dir = testenv.EarlierRelease(t)
	_, out := testenv.EarlierReleaseBuild(t, "manager", func(src, out string) error {
		// -trimpath: the build cache serves the packages that did not change since, whatever the folder.
		build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(out, "quartermaster"), "./cmd/quartermaster")
		build.Dir = src
		build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
		if b, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("%w\n%s", err, b)
		}
		return nil
	})
	r.bin = filepath.Join(out, "quartermaster")
	return r
}

// adoptCRDs marks the cluster's CRDs of the charts at dirs as the release's, and when the test ends
// applies config/crd/bases again and takes the marks off. It returns their names.
func adoptCRDs(t *testing.T, h testenv.Helm, dirs ...string) []string {
	t.Helper()
	var names []string
	for _, dir := range dirs {
		out, err := h.Run("template", upRelease, dir, "--namespace", upNamespace)
		must(t, err)
		objs, err := chart.Objects(out)
		must(t, err)
		for _, o := range objs {
			if o.GetKind() == "CustomResourceDefinition" && !slices.Contains(names, o.GetName()) {
				names = append(names, o.GetName())
			}
		}
	}
	mark := func(label string, annotations ...string) {
		for _, n := range names {
			kubectlOK(t, "label", "--overwrite", "crd", n, label)
			kubectlOK(t, append([]string{"annotate", "--overwrite", "crd", n}, annotations...)...)
		}
	}
	mark("app.kubernetes.io/managed-by=Helm", "meta.helm.sh/release-name="+upRelease, "meta.helm.sh/release-namespace="+upNamespace)
	t.Cleanup(func() {
		kubectlOK(t, "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(testenv.RepoRoot(), "config", "crd", "bases"))
		mark("app.kubernetes.io/managed-by-", "meta.helm.sh/release-name-", "meta.helm.sh/release-namespace-", "helm.sh/resource-policy-")
	})
	return names
}

// storedVersions reads each CRD's status.storedVersions: the versions its objects may be stored in.
func storedVersions(t *testing.T, crds []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range crds {
		out[n] = kubectlOK(t, "get", "crd", n, "-o", "jsonpath={.status.storedVersions}")
	}
	return out
}

// readBack reads each object as the API serves it now and keeps what a user wrote: its spec (or a
// ConfigMap's data) and its generation (a write that changed nothing visible still counts).
func readBack(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, o := range objs {
		now := &unstructured.Unstructured{}
		now.SetGroupVersionKind(o.GroupVersionKind())
		must(t, admin.Get(context.Background(), client.ObjectKeyFromObject(o), now))
		out[o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName()] = map[string]any{"spec": now.Object["spec"], "generation": now.GetGeneration()}
	}
	return out
}

// nothingLost checks what a rollout must not have broken: nothing Stalled, every request's Namespace
// created once and its Secret written once, the IAM policy and a role per IAMServiceAccount each
// created once (the ID IAM gave it first), and every VM cloned once with none removed.
func nothingLost(t *testing.T, phase, ns string, writes *writeLog, load *loadGenerator, emu *iamEmulatorProcess, sim *vsimtest.Sim, iamIDs map[string]string) {
	t.Helper()
	for _, get := range [][]string{{"-n", ns, "iampolicy,iamsa,vg,sib,np"}, {"rm/" + upPrefix + "docker-hub", "si/" + upPrefix + "dns-manipulation"}} {
		args := append([]string{"get", "-o", `jsonpath={range .items[*]}{.kind}/{.metadata.name}={.status.conditions[?(@.type=="Stalled")].status}{"\n"}{end}`}, get...)
		for line := range strings.Lines(kubectlOK(t, args...)) {
			if strings.HasSuffix(strings.TrimSpace(line), "=True") {
				t.Errorf("%s: %s is Stalled", phase, strings.TrimSpace(line))
			}
		}
	}
	for _, name := range load.names {
		if got := writes.of("Namespace/" + name); len(got) == 0 || got[0] != watch.Added ||
			slices.Contains(got[1:], watch.Added) || slices.Contains(got, watch.Deleted) {
			t.Errorf("%s: Namespace %s: events %v, want one creation", phase, name, got)
		}
		if got := writes.of("Secret/" + name); !slices.Equal(got, []watch.EventType{watch.Added}) {
			t.Errorf("%s: Secret %s: events %v, want written once (a second write is a second token)", phase, name, got)
		}
	}
	st := emu.state(t)
	have := map[string]string{}
	for _, r := range st.Roles {
		have[r.Name] = r.ID
	}
	for _, p := range st.Policies {
		have[p.Name] = p.ID
	}
	want := []string{irsa.PolicyName(ns, "read-reports"), irsa.RoleName(ns, "reports")}
	for i := range load.roles {
		want = append(want, irsa.RoleName(ns, fmt.Sprintf("load-%03d", i)))
	}
	for _, name := range want {
		switch id, first := have[name], iamIDs[name]; {
		case id == "":
			t.Errorf("%s: no IAM role or policy %s", phase, name)
		case first == "":
			iamIDs[name] = id
		case id != first:
			t.Errorf("%s: IAM %s was created again (ID %s, first %s)", phase, name, id, first)
		}
	}
	if got := len(sim.VMs(t, "/DC0/vm/"+ns+"-"+upPrefix+"busy")); int64(got) != load.replicas {
		t.Errorf("%s: %d VMs in busy's folder, want %d", phase, got, load.replicas)
	}
	clonedOnce(t, sim, []string{ns + "-" + upPrefix + "web", ns + "-" + upPrefix + "busy"}, 3+int(load.replicas))
}

// loadGenerator keeps the controllers busy: each tick (at most every 200ms) creates a namespace
// request, every third an IAMServiceAccount, every fifth scales the VmGroup busy up by one. It records when it asked, so
// the longest wait can be read from when each was served.
type loadGenerator struct {
	ns, busy string
	served   *firstSeen
	names    []string // the namespace requests, in order
	asked    map[string]time.Time
	roles    int   // IAMServiceAccounts created by the load
	replicas int64 // busy's spec.replicas
	ticks    int
	last     time.Time
	since    time.Time // the rollout's start: waits are reported for what was asked after it
	// longestWhat names the object that waited longest.
	longestWhat string
}

func (l *loadGenerator) begin() { l.since = time.Now() }

func (l *loadGenerator) request(t *testing.T) {
	t.Helper()
	name := fmt.Sprintf("%s%03d", upPrefix, len(l.names))
	if l.asked == nil {
		l.asked = map[string]time.Time{}
	}
	l.asked[name] = time.Now()
	must(t, admin.Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: upRequests, Name: name}}))
	leaveNamespaces(t, name)
	l.names = append(l.names, name)
}

func (l *loadGenerator) tick(t *testing.T) {
	t.Helper()
	if time.Since(l.last) < 200*time.Millisecond {
		return
	}
	l.last = time.Now()
	l.ticks++
	l.request(t)
	if l.ticks%3 == 0 {
		kubectlApply(t, l.ns, fmt.Sprintf("{apiVersion: iam.quartermaster.dev/v1alpha1, kind: IAMServiceAccount, metadata: {name: load-%03d}, "+
			"spec: {serviceAccountName: load-%03d, createServiceAccount: true, managedPolicyArns: [%q]}}", l.roles, l.roles, readOnlyARN))
		l.roles++
	}
	if l.ticks%5 == 0 && l.replicas < 8 {
		l.replicas++
		patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, l.replicas)
		vg := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "compute.quartermaster.dev/v1alpha1", "kind": "VmGroup"}}
		vg.SetNamespace(l.ns)
		vg.SetName(l.busy)
		must(t, admin.Patch(context.Background(), vg, client.RawPatch(types.MergePatchType, []byte(patch))))
	}
}

// longest is the longest a request asked for after the rollout began waited to be served.
func (l *loadGenerator) longest() time.Duration {
	var longest time.Duration
	for name, at := range l.asked {
		if at.Before(l.since) {
			continue
		}
		if d := l.served.at(name).Sub(at); d > longest {
			longest, l.longestWhat = d, "request "+name
		}
	}
	return longest
}

// firstSeen records when each object was first seen meeting a condition.
type firstSeen struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

func newFirstSeen() *firstSeen { return &firstSeen{seen: map[string]time.Time{}} }

func (f *firstSeen) follow(w watch.Interface, cond func(client.Object) bool) {
	for e := range w.ResultChan() {
		o, ok := e.Object.(client.Object)
		if !ok || !cond(o) {
			continue
		}
		f.mu.Lock()
		if _, ok := f.seen[o.GetName()]; !ok {
			f.seen[o.GetName()] = time.Now()
		}
		f.mu.Unlock()
	}
}

func (f *firstSeen) has(name string) bool { return !f.at(name).IsZero() }

func (f *firstSeen) at(name string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[name]
}

// podRunner is the kubelet of the release's manager pods (kwok runs no containers): a pod that
// runs gets its manager process, built from the release its image tag names, exactly as the pod
// says (chart.ProcessFor); a pod that is being deleted or gone gets SIGTERM.
type podRunner struct {
	t        *testing.T
	bins     map[string]string // image tag -> binary
	procs    map[types.UID]*process
	tags     map[types.UID]string // the image tag each process was started for
	selector client.MatchingLabels
	started  int
	newest   *process
}

func newPodRunner(t *testing.T, bins map[string]string) *podRunner {
	t.Helper()
	deploy := &appsv1.Deployment{}
	must(t, admin.Get(context.Background(), client.ObjectKey{Namespace: upNamespace, Name: upRelease + "-manager"}, deploy))
	return &podRunner{t: t, bins: bins, procs: map[types.UID]*process{}, tags: map[types.UID]string{}, selector: deploy.Spec.Selector.MatchLabels}
}

// sync starts and stops processes to match the pods, and reports whether every pod that runs has
// its process and no process outlived its pod.
func (r *podRunner) sync(ctx context.Context) bool {
	t := r.t
	t.Helper()
	pods := &corev1.PodList{}
	if err := admin.List(ctx, pods, client.InNamespace(upNamespace), r.selector); err != nil {
		return false
	}
	live := map[types.UID]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		live[pod.UID] = true
		if r.procs[pod.UID] != nil {
			continue
		}
		_, tag, _ := strings.Cut(pod.Spec.Containers[0].Image, ":")
		bin := r.bins[tag]
		if bin == "" {
			t.Fatalf("pod %s runs image %s: no build for its tag", pod.Name, pod.Spec.Containers[0].Image)
		}
		proc, err := chart.ProcessFor(ctx, admin, pod, "manager", t.TempDir())
		must(t, err)
		r.started++
		// The process environment is the test's (without its AWS settings: processEnv) plus the
		// Pod's, the machine's AWS profile and instance metadata kept out.
		env := append([]string{"AWS_PROFILE=", "AWS_CONFIG_FILE=", "AWS_SHARED_CREDENTIALS_FILE=", "AWS_EC2_METADATA_DISABLED=true"}, proc.Env...)
		r.newest = startBinaryAs(t, bin, fmt.Sprintf("manager %d (%s, pod %s)", r.started, tag, pod.Name), upNamespace, proc.ServiceAccount, env, proc.Args...)
		r.procs[pod.UID] = r.newest
		r.tags[pod.UID] = tag
	}
	for uid, p := range r.procs {
		if !live[uid] {
			p.stop(t)
			delete(r.procs, uid)
			delete(r.tags, uid)
		}
	}
	return len(r.procs) == len(live)
}

// settled syncs and reports whether the release's pods all run its newest ReplicaSet's template
// with a process each.
func (r *podRunner) settled(ctx context.Context) bool {
	if !r.sync(ctx) {
		return false
	}
	pods := &corev1.PodList{}
	if err := admin.List(ctx, pods, client.InNamespace(upNamespace), r.selector); err != nil {
		return false
	}
	hashes := map[string]bool{}
	for _, p := range pods.Items {
		hashes[p.Labels[appsv1.DefaultDeploymentUniqueLabelKey]] = true
	}
	return len(hashes) == 1 && len(pods.Items) == len(r.procs)
}

// rollingBack marks the processes of the newer build tag as running under the earlier release's
// RBAC from now on: a rollback installs the earlier roles before the Deployment replaces their pods.
func (r *podRunner) rollingBack(tag string) {
	for uid, p := range r.procs {
		if r.tags[uid] == tag {
			p.olderRBACSince = time.Now()
		}
	}
}

func (r *podRunner) running() int { return len(r.procs) }

// last is the newest manager (its logs are shown when a wait fails).
func (r *podRunner) last() *process { return r.newest }

// waitFor polls cond, keeping the processes in step with the pods meanwhile.
func (r *podRunner) waitFor(ctx context.Context, what string, cond func() bool) {
	r.t.Helper()
	eventually(r.t, what, func() bool {
		r.sync(ctx)
		return cond()
	})
}
