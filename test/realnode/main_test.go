//go:build e2e

// Package realnode runs Quartermaster as its users run it, on a real one-node cluster
// (hack/real-cluster.sh) that TestMain starts and stops: make image's archive loaded into the
// node's containerd, the chart installed with Helm (--wait), and every system doing its job
// through real Pods — the manager's replicas under the chart's securityContext, the registry
// mirror's cache and node agent, a kubelet pulling a Pod's image through the mirror.
package realnode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/realcluster"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// The release as a platform admin would install it: the chart's default names.
const (
	release          = "quartermaster"
	releaseNamespace = "quartermaster-system"
	mirrorsNamespace = "quartermaster-mirrors"
	requestsNS       = "namespace-requests"
	// scrapeNamespace holds the ServiceAccount the chart binds to the metrics-reader role.
	scrapeNamespace = "qm-real-scrape"
	// testImages are the test's own programs (hack/node-image), loaded into the node.
	kubeclientImage = "docker.io/local/kubeclient:e2e"
)

var (
	cluster *realcluster.Cluster
	admin   client.Client
	kube    kubernetes.Interface
	// installTime is helm install's time to every workload Ready (reported by make bench too).
	installTime time.Duration
	// valuesFile holds the chart's values as installed (removed when the run ends).
	valuesFile string
	// imageTag is this run's own: a reused cluster's Deployment rolls to the image just built.
	imageTag = "e2e-" + strconv.FormatInt(time.Now().Unix(), 36)
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "realnode: a real node needs root (network namespaces, mounts, runc); CI runs as root")
		return 1
	}
	// A name of this run's own: two runs on one machine (a developer's beside CI's) never meet.
	// Clusters of killed runs are torn down by Up (hack/real-cluster.sh gc). QM_REAL_CLUSTER names
	// the cluster instead; if it runs already (kept by QM_E2E_KEEP_CLUSTER), it is reused and the
	// chart upgraded in place: the quick loop while writing a test.
	name := os.Getenv("QM_REAL_CLUSTER")
	var err error
	if name != "" {
		if cluster, err = realcluster.Open(name); err == nil && cluster.Running() {
			fmt.Fprintf(os.Stderr, "realnode: reusing the running cluster %s\n", name)
		} else {
			cluster = nil
		}
	} else {
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		name = "qm-real-" + hex.EncodeToString(b)
	}
	if cluster == nil {
		start := time.Now()
		if cluster, err = realcluster.Up(name); err != nil {
			fmt.Fprintln(os.Stderr, "realnode: starting the real cluster:", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "realnode: cluster %s up in %s\n", name, time.Since(start).Round(100*time.Millisecond))
	}
	if os.Getenv("QM_E2E_KEEP_CLUSTER") == "" {
		defer func() {
			if err := cluster.Down(); err != nil {
				fmt.Fprintln(os.Stderr, "realnode: stopping the real cluster:", err)
			}
		}()
	} else {
		fmt.Fprintf(os.Stderr, "realnode: keeping the cluster: KUBECONFIG=%s; hack/real-cluster.sh down %s\n", cluster.Kubeconfig, name)
	}
	// The upstream registries the tests serve log every request through logrus: warnings only.
	logrus.SetLevel(logrus.WarnLevel)
	scheme := manager.Scheme(computev1alpha1.AddToScheme, iamv1alpha1.AddToScheme, intentv1alpha1.AddToScheme, securityv1alpha1.AddToScheme, registryv1alpha1.AddToScheme)
	if admin, err = client.New(cluster.Config, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, "realnode:", err)
		return 1
	}
	if kube, err = kubernetes.NewForConfig(cluster.Config); err != nil {
		fmt.Fprintln(os.Stderr, "realnode:", err)
		return 1
	}
	if err := loadImages(); err != nil {
		fmt.Fprintln(os.Stderr, "realnode:", err)
		return 1
	}
	defer func() {
		if valuesFile != "" {
			os.Remove(valuesFile)
		}
	}()
	emuURL, stopOutside, err := startOutsideSystems(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "realnode: starting the IAM emulator and vcsim:", err)
		return 1
	}
	defer stopOutside()
	if err := install(emuURL); err != nil {
		fmt.Fprintln(os.Stderr, "realnode: installing the chart:", err)
		for _, c := range []string{"kubelet", "containerd"} {
			fmt.Fprintf(os.Stderr, "--- %s (last lines)\n%s\n", c, cluster.Log(c, 30))
		}
		return 1
	}
	code := m.Run()
	// Over the whole run (minutes: past every sync timeout) no manager container restarted: a
	// standby that cannot sync its caches exits every two minutes, which no single test outlives.
	if err := managerRestarts(); err != nil {
		fmt.Fprintln(os.Stderr, "realnode:", err)
		return 1
	}
	return code
}

// managerRestarts names each manager container that restarted, with why it last ended.
func managerRestarts() error {
	pods := &corev1.PodList{}
	if err := admin.List(context.Background(), pods, client.InNamespace(releaseNamespace), managerLabels); err != nil {
		return err
	}
	var restarted []string
	for _, p := range pods.Items {
		for _, s := range p.Status.ContainerStatuses {
			if s.RestartCount == 0 {
				continue
			}
			why := ""
			if t := s.LastTerminationState.Terminated; t != nil {
				why = fmt.Sprintf(" (exit %d: %s)", t.ExitCode, t.Message)
			}
			restarted = append(restarted, fmt.Sprintf("%s/%s restarted %d times%s", p.Name, s.Name, s.RestartCount, why))
		}
	}
	if len(restarted) > 0 {
		return fmt.Errorf("manager containers restarted during the run: %s", strings.Join(restarted, "; "))
	}
	return nil
}

// loadImages builds the manager's image as make image does (for this machine's platform only) and
// the test's own images, and imports them into the node.
func loadImages() error {
	start := time.Now()
	if err := cluster.LoadProjectImage(imageTag); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "qm-real-images")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	kc := filepath.Join(dir, "kubeclient.tar")
	if err := command(testenv.RepoRoot(), "go", "run", "./hack/node-image", "--out", kc, "--ref", kubeclientImage,
		"--entrypoint", "/kubeclient", "--user", "65532:65532", "--build", "./test/realnode/kubeclient=/kubeclient"); err != nil {
		return err
	}
	if err := cluster.Load("", kc); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "realnode: images built and loaded in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// The outside systems the manager's iam and vmgroups controllers talk to, run where AWS and vCenter
// would be for a cluster: outside it, on the host, reached through the node's link.
const (
	awsAccount  = "000000000000"
	eksCluster  = "real"
	vmTemplate  = "ubuntu-22.04-template"
	readOnlyARN = "arn:aws:iam::aws:policy/ReadOnlyAccess"
)

var (
	iamEmulator *iamemulator.Server
	vcenter     *vsimtest.Sim
)

// startOutsideSystems starts the IAM (with STS and EKS) emulator and vcsim on the node's link.
func startOutsideSystems(ctx context.Context) (emuURL string, stop func(), err error) {
	iamEmulator = iamemulator.New(iamemulator.Options{AccountID: awsAccount, EKSClusters: []string{eksCluster}})
	ln, err := net.Listen("tcp", net.JoinHostPort(cluster.HostIP, "0"))
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: iamEmulator, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	if vcenter, err = vsimtest.NewOn(ctx, cluster.HostIP); err != nil {
		_ = srv.Close()
		return "", nil, err
	}
	if vcenter.Guests, err = vcenter.StartGuests(ctx); err != nil {
		vcenter.Stop()
		_ = srv.Close()
		return "", nil, err
	}
	if _, err := vcenter.CreateTemplate(ctx, vmTemplate); err != nil {
		vcenter.Stop()
		_ = srv.Close()
		return "", nil, err
	}
	return "http://" + ln.Addr().String(), func() { vcenter.Stop(); _ = srv.Close() }, nil
}

// install installs the chart as a platform admin would (helm install --wait), every controller
// on: iam and vmgroups with their credentials in Secrets made first, the intents controller for
// the one engine this cluster is to have, Kyverno (intents.engines). It waits for every workload
// to be Ready; a Pod that cannot start (an image not on the node, a container crashing) fails it
// at once, named.
func install(emuURL string) error {
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scrapeNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: scrapeNamespace, Name: "scraper"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNamespace}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: releaseNamespace, Name: "vcenter"},
			StringData: map[string]string{"VC_HOST": vcenter.URL.String(), "VC_USER": vcenter.User, "VC_PASS": vcenter.Password}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: releaseNamespace, Name: "aws-credentials"},
			StringData: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDREALNODEEXAMPLE", "AWS_SECRET_ACCESS_KEY": "real-node-secret-key"}},
	} {
		if _, ok := o.(*corev1.Secret); ok {
			// A reused cluster holds an earlier run's: this run's emulators have new credentials.
			if err := admin.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		if err := admin.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	values := map[string]any{
		"image":    map[string]any{"repository": "quartermaster", "tag": imageTag, "pullPolicy": "Never"},
		"metrics":  map[string]any{"readerSubjects": []any{map[string]any{"kind": "ServiceAccount", "name": "scraper", "namespace": scrapeNamespace}}},
		"vmgroups": map[string]any{"enabled": true, "vcenterSecret": "vcenter", "insecure": true},
		"iam": map[string]any{
			"enabled": true, "clusterName": eksCluster, "oidcIssuer": "https://oidc.example.com/id/REAL", "awsAccountId": awsAccount,
			"allowedPolicyArns": []any{readOnlyARN},
			"aws": map[string]any{"region": "us-east-1", "iamEndpoint": emuURL, "stsEndpoint": emuURL, "eksEndpoint": emuURL,
				"credentialsSecret": "aws-credentials"},
		},
		"intents": map[string]any{"engines": "kyverno"},
	}
	data, err := yaml.Marshal(values)
	if err != nil {
		return err
	}
	valuesFile = filepath.Join(os.TempDir(), "qm-real-values-"+cluster.Name+".yaml")
	if err := os.WriteFile(valuesFile, data, 0o600); err != nil {
		return err
	}
	if installTime, err = cluster.InstallChart(release, releaseNamespace, valuesFile); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "realnode: helm install --wait: every workload Ready in %s\n", installTime.Round(100*time.Millisecond))
	return nil
}

// stuckPods names each container of namespace's Pods that cannot start by itself.
func stuckPods(ctx context.Context, namespace string) error { return cluster.StuckPods(ctx, namespace) }

func command(dir, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}
