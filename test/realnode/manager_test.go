//go:build e2e

package realnode

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// managerLabels select the manager's Pods (the chart's selector labels and component).
var managerLabels = client.MatchingLabels{"app.kubernetes.io/name": "quartermaster", "app.kubernetes.io/component": "manager"}

// TestManagerRunsAsInstalled: the chart's two manager replicas run on the node from the loaded
// image under the chart's securityContext — the kubelet started each as uid 65532 with a read-only
// root (read from the container's own process) — one of them leads, their probes answer (Ready),
// /metrics answers through the Service to a token bound to the metrics-reader role and to nobody
// else, and when the leader's Pod is deleted the other replica takes the Lease.
func TestManagerRunsAsInstalled(t *testing.T) {
	ctx := context.Background()
	pods := managerPods(t, 2)
	for _, p := range pods {
		if !podReady(&p) {
			t.Errorf("pod %s is not Ready", p.Name)
		}
		proc := containerProcess(t, &p, "/quartermaster")
		if proc.uid != "65532" {
			t.Errorf("pod %s: the manager runs as uid %s, want 65532", p.Name, proc.uid)
		}
		if !proc.rootReadOnly {
			t.Errorf("pod %s: the manager's root filesystem is writable, want read-only", p.Name)
		}
	}

	leader := leaseHolder(t)
	var other string
	for _, p := range pods {
		if p.Name != leader {
			other = p.Name
		}
	}
	if other == "" || leader == other {
		t.Fatalf("the Lease is held by %q, which is not one of the two manager pods", leader)
	}

	// /metrics through the Service, as a scraper in the cluster would reach it.
	svc := &corev1.Service{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: release + "-metrics"}, svc))
	url := fmt.Sprintf("https://%s:%d/metrics", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
	scraper := token(t, scrapeNamespace, "scraper")
	stranger := token(t, scrapeNamespace, "default")
	code, body := scrape(t, url, scraper)
	if code != http.StatusOK || !strings.Contains(body, "controller_runtime_") || !strings.Contains(body, "leader_election_master_status") {
		t.Errorf("scrape with the metrics-reader's token: %d, want 200 with the manager's families\n%.400s", code, body)
	}
	if code, body := scrape(t, url, ""); code != http.StatusUnauthorized {
		t.Errorf("scrape without a token: %d, want 401\n%.200s", code, body)
	}
	if code, body := scrape(t, url, stranger); code != http.StatusForbidden {
		t.Errorf("scrape with a token not bound to metrics-reader: %d, want 403\n%.200s", code, body)
	}

	// kubectl delete pod of the leader: a running replica takes over. The standby usually does; the
	// Deployment's replacement Pod starts at once and may win the race for the released Lease.
	start := time.Now()
	must(t, admin.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: releaseNamespace, Name: leader}}))
	var holder string
	eventually(t, "another replica to take the Lease", func() bool {
		holder = leaseHolder(t)
		if holder == "" || holder == leader {
			return false
		}
		p := &corev1.Pod{}
		return admin.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: holder}, p) == nil && p.DeletionTimestamp == nil
	})
	who := "the standby"
	if holder != other {
		who = "the replacement Pod"
	}
	t.Logf("the Lease passed from %s to %s (%s) %s after the leader's Pod was deleted", leader, holder, who, time.Since(start).Round(100*time.Millisecond))
	eventually(t, "two Ready manager pods again", func() bool {
		ready := 0
		list := &corev1.PodList{}
		if admin.List(ctx, list, client.InNamespace(releaseNamespace), managerLabels) != nil {
			return false
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && podReady(&p) {
				ready++
			}
		}
		return ready == 2
	})
}

// TestNamespaceKubeconfigWorksFromAPod: a namespace request served by the installed manager, and
// its kubeconfig used as a CI runner Pod would use it — from a Pod on the node, through the
// API server address the kubeconfig names — creates a Deployment in its namespace and is refused
// in another.
func TestNamespaceKubeconfigWorksFromAPod(t *testing.T) {
	ctx := context.Background()
	name := "real-ci-" + imageTag // this run's own (a reused cluster keeps earlier runs' namespaces a while)
	must(t, admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: name}}))
	t.Cleanup(func() {
		_ = admin.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: name}})
	})
	cm := &corev1.ConfigMap{}
	eventually(t, "the request to be Ready", func() bool {
		err := admin.Get(ctx, client.ObjectKey{Namespace: requestsNS, Name: name}, cm)
		return err == nil && cm.Annotations[nsrequest.AnnotationStatus] == "Ready"
	})
	handed := &corev1.Secret{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: requestsNS, Name: name}, handed))

	// The runner's namespace holds the kubeconfig as the pipeline stored it.
	runner := newNamespace(t, "real-runner")
	other := newNamespace(t, "real-other")
	must(t, admin.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: runner, Name: "kubeconfig"},
		Data:       map[string][]byte{"kubeconfig": handed.Data["kubeconfig"]},
	}))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: runner, Name: "pipeline"},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				Name: "job", Image: kubeclientImage, ImagePullPolicy: corev1.PullNever,
				Args:         []string{"--kubeconfig=/etc/kubeconfig/kubeconfig", "--namespace=" + name, "--other=" + other},
				VolumeMounts: []corev1.VolumeMount{{Name: "kubeconfig", MountPath: "/etc/kubeconfig", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "kubeconfig", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kubeconfig"}}}},
		},
	}
	must(t, admin.Create(ctx, pod))
	phase := waitPodDone(t, pod)
	logs := podLogs(t, pod, "job")
	if phase != corev1.PodSucceeded {
		t.Fatalf("the pipeline Pod ended %s:\n%s", phase, logs)
	}
	if !strings.Contains(logs, "created deployment "+name+"/app") ||
		!strings.Contains(logs, "refused in "+other) {
		t.Fatalf("the pipeline Pod's output:\n%s", logs)
	}
	kubernetesSvc := &corev1.Service{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: "default", Name: "kubernetes"}, kubernetesSvc))
	if !strings.Contains(logs, "server: https://"+kubernetesSvc.Spec.ClusterIP) {
		t.Errorf("the kubeconfig does not name the kubernetes Service's address %s:\n%s", kubernetesSvc.Spec.ClusterIP, logs)
	}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: name, Name: "app"}, &appsv1.Deployment{}))
	if err := admin.Get(ctx, client.ObjectKey{Namespace: other, Name: "app"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Deployment in %s: want none, got %v", other, err)
	}
}

// managerPods waits for n Running manager pods and returns them.
func managerPods(t *testing.T, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	eventually(t, fmt.Sprintf("%d Ready manager pods", n), func() bool {
		list := &corev1.PodList{}
		if admin.List(context.Background(), list, client.InNamespace(releaseNamespace), managerLabels) != nil {
			return false
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && podReady(&p) {
				pods = append(pods, p)
			}
		}
		return len(pods) == n
	})
	return pods
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// leaseHolder is the manager pod holding the leader election Lease (its identity is the pod's
// name and a suffix).
func leaseHolder(t *testing.T) string {
	t.Helper()
	lease := &coordinationv1.Lease{}
	if err := admin.Get(context.Background(), client.ObjectKey{Namespace: releaseNamespace, Name: "quartermaster.quartermaster.dev"}, lease); err != nil {
		return ""
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	name, _, _ := strings.Cut(holder, "_")
	return name
}

func token(t *testing.T, namespace, sa string) string {
	t.Helper()
	tr, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
	must(t, err)
	return tr.Status.Token
}

func scrape(t *testing.T, url, token string) (int, string) {
	t.Helper()
	insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the manager's self-signed serving cert
	req, err := http.NewRequest(http.MethodGet, url, nil)
	must(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := insecure.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// process is what the node's kernel says of a container's main process.
type process struct {
	pid          string
	uid          string
	rootReadOnly bool
}

// containerProcess finds the process running exe in pod (by its cgroup, which names the pod's
// UID) and reads its uid and whether its root is mounted read-only.
func containerProcess(t *testing.T, pod *corev1.Pod, exe string) process {
	t.Helper()
	uid := strings.ReplaceAll(string(pod.UID), "-", "_")
	podCgroup := "pod" + string(pod.UID)
	entries, err := os.ReadDir("/proc")
	must(t, err)
	for _, e := range entries {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", pid, "cgroup"))
		if err != nil || (!bytes.Contains(cg, []byte(podCgroup)) && !bytes.Contains(cg, []byte(uid))) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		if !bytes.HasPrefix(cmdline, []byte(exe+"\x00")) {
			continue
		}
		p := process{pid: pid}
		status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
		must(t, err)
		sc := bufio.NewScanner(bytes.NewReader(status))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) > 1 && f[0] == "Uid:" {
				p.uid = f[1]
			}
		}
		mounts, err := os.ReadFile(filepath.Join("/proc", pid, "mountinfo"))
		must(t, err)
		sc = bufio.NewScanner(bytes.NewReader(mounts))
		for sc.Scan() {
			// mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ...
			if f := strings.Fields(sc.Text()); len(f) > 5 && f[4] == "/" {
				p.rootReadOnly = strings.HasPrefix(f[5], "ro")
			}
		}
		return p
	}
	t.Fatalf("no process %s of pod %s on the node", exe, pod.Name)
	return process{}
}

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T, name string) string {
	t.Helper()
	must(t, admin.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	t.Cleanup(func() {
		_ = admin.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	return name
}

// waitPodDone waits for pod to end (Succeeded or Failed); a container that cannot start fails the
// test at once with its reason.
func waitPodDone(t *testing.T, pod *corev1.Pod) corev1.PodPhase {
	t.Helper()
	var phase corev1.PodPhase
	eventually(t, "pod "+pod.Name+" to end", func() bool {
		if err := stuckPods(context.Background(), pod.Namespace); err != nil {
			t.Fatal(err)
		}
		p := &corev1.Pod{}
		if admin.Get(context.Background(), client.ObjectKeyFromObject(pod), p) != nil {
			return false
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed
	})
	return phase
}

// podLogs reads a container's log through the API server (which asks the kubelet).
func podLogs(t *testing.T, pod *corev1.Pod, container string) string {
	t.Helper()
	b, err := kube.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: container}).DoRaw(context.Background())
	must(t, err)
	return string(b)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// eventually is testenv.PollFor every 100 ms for up to two minutes; cond says no more than
// whether it holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.PollFor(t, what, 100*time.Millisecond, 2*time.Minute, func() (bool, string) { return cond(), "" })
}

// TestAnImageNotOnTheNodeIsNamedAtOnce: the harness's wait (helm install's, every Pod wait of these
// tests) ends as soon as the kubelet says a Pod's image is not on the node, naming the image and the
// kubelet's reason, instead of waiting out its timeout.
func TestAnImageNotOnTheNodeIsNamedAtOnce(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "real-missing-image")
	const image = "docker.io/local/never-loaded:1"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "missing"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullNever}}},
	}
	must(t, admin.Create(ctx, pod))
	var err error
	eventually(t, "the missing image to be named", func() bool {
		err = stuckPods(ctx, ns)
		return err != nil
	})
	if !strings.Contains(err.Error(), "(image "+image+"): ErrImageNeverPull") {
		t.Errorf("the harness says %v, want the image and the kubelet's ErrImageNeverPull", err)
	}
}
