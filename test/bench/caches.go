package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

// unrelatedObjects is how many ConfigMaps, and as many Secrets, of no controller's concern the
// case creates.
const unrelatedObjects = 10000

// idleWindow is how long API requests are counted with nothing to do, before and after the
// unrelated objects: long enough to include the controllers' periodic work (the intents engine
// check every 10 s).
const idleWindow = 20 * time.Second

// cachesBench runs the manager as its own process with every controller on (iam with the
// ConfigMap compat mode, vmgroups against vcsim, mirrors, intents, namespaces), then creates
// 10,000 ConfigMaps and 10,000 Secrets that none of them owns, and reports its RSS and its API
// requests in an idle window before and after: a controller that cached or listed them would show.
func cachesBench(ctx context.Context, e *env) ([]result, error) {
	if err := installAllCRDs(ctx, e); err != nil {
		return nil, err
	}
	const ns, requestsNS, unrelatedNS = "bench-caches", "bench-caches-requests", "bench-unrelated"
	if err := e.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: unrelatedNS}}); err != nil {
		return nil, err
	}
	out, err := startOutsideSystems(ctx, e, ns, requestsNS)
	if err != nil {
		return nil, err
	}
	defer out.stop()
	metricsAddr, err := freePort()
	if err != nil {
		return nil, err
	}
	p, err := startProcess(e, append(out.args, "--controllers=namespaces,iam,vmgroups,mirrors,intents",
		"--metrics-bind-address="+metricsAddr, "--metrics-secure=false", "--iam-configmap-compat")...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.stop() }() // the case's own stop reports an error; this one only cleans up
	cs, err := kubernetes.NewForConfig(e.cluster.Config)
	if err != nil {
		return nil, err
	}
	// Up and serving: one namespace request answered.
	if _, err := requestAndWaitForSecret(ctx, e, cs, requestsNS, "bench-caches-warmup", 2*time.Minute); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, p.logs.Tail(4000))
	}
	idle := func() (requests float64, rss float64, err error) {
		before, err := apiRequests(metricsAddr)
		if err != nil {
			return 0, 0, err
		}
		time.Sleep(idleWindow)
		after, err := apiRequests(metricsAddr)
		if err != nil {
			return 0, 0, err
		}
		rss, err = p.rssMiB()
		return after - before, rss, err
	}
	requestsBefore, rssBefore, err := idle()
	if err != nil {
		return nil, err
	}

	data := map[string]string{"payload": strings.Repeat("x", 512)}
	start := time.Now()
	if err := parallel(16, 2*unrelatedObjects, func(i int) error {
		meta := metav1.ObjectMeta{Namespace: unrelatedNS, Name: "unrelated-" + strconv.Itoa(i/2)}
		if i%2 == 0 {
			return e.client.Create(ctx, &corev1.ConfigMap{ObjectMeta: meta, Data: data})
		}
		return e.client.Create(ctx, &corev1.Secret{ObjectMeta: meta, StringData: data})
	}); err != nil {
		return nil, err
	}
	created := time.Since(start)
	requestsAfter, rssAfter, err := idle()
	if err != nil {
		return nil, err
	}
	if err := p.stop(); err != nil {
		return nil, err
	}
	return []result{
		{metric: "manager RSS, every controller on, idle", value: rssBefore, unit: "MiB"},
		{metric: fmt.Sprintf("manager RSS after %d unrelated ConfigMaps and %d Secrets", unrelatedObjects, unrelatedObjects), value: rssAfter, unit: "MiB",
			note: fmt.Sprintf("growth %.1f MiB (target ≤ 10 MB); created in %.0f s", rssAfter-rssBefore, created.Seconds())},
		{metric: fmt.Sprintf("manager API requests in %s idle, before", idleWindow), value: requestsBefore, unit: "requests"},
		{metric: fmt.Sprintf("manager API requests in %s idle, after", idleWindow), value: requestsAfter, unit: "requests",
			note: "target: no more than before"},
	}, nil
}

// outsideSystems are the IAM emulator and vcsim (with the template bench-template), in process,
// for a manager process running namespaces, iam and vmgroups, and the flags that point it at them
// (the AWS SDK reads its endpoint from the environment, which the process inherits).
type outsideSystems struct {
	args []string
	iam  *iamemulator.Server
	sim  *vsimtest.Sim
	stop func()
}

// startOutsideSystems creates the namespaces ns (where the vCenter Secret goes) and requestsNS,
// and starts the outside systems.
func startOutsideSystems(ctx context.Context, e *env, ns, requestsNS string) (*outsideSystems, error) {
	for _, n := range []string{ns, requestsNS} {
		if err := e.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			return nil, err
		}
	}
	emu := iamemulator.New(iamemulator.Options{Seed: 1})
	srv := httptest.NewServer(emu)
	sim, err := vsimtest.New(ctx)
	if err != nil {
		srv.Close()
		return nil, err
	}
	out := &outsideSystems{iam: emu, sim: sim, stop: func() { sim.Stop(); srv.Close() }}
	if _, err := sim.CreateTemplate(ctx, "bench-template"); err != nil {
		out.stop()
		return nil, err
	}
	if err := e.client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vcenter"},
		StringData: map[string]string{"VC_HOST": sim.URL.String(), "VC_USER": sim.User, "VC_PASS": sim.Password},
	}); err != nil {
		out.stop()
		return nil, err
	}
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_IAM": srv.URL, "AWS_ENDPOINT_URL_STS": srv.URL, "AWS_REGION": "us-east-1",
		"AWS_ACCESS_KEY_ID": "AKIDBENCHEXAMPLE", "AWS_SECRET_ACCESS_KEY": "bench-not-a-secret",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		if err := os.Setenv(k, v); err != nil {
			out.stop()
			return nil, err
		}
	}
	out.args = []string{"--requests-namespace=" + requestsNS, "--namespace-defaults=" + defaultsFile(),
		"--cluster-name=bench", "--oidc-issuer=https://oidc.example.com/bench", "--aws-account-id=000000000000",
		"--allowed-policy-arns=arn:aws:iam::aws:policy/ReadOnlyAccess",
		"--vsphere-secret=" + ns + "/vcenter", "--vsphere-insecure"}
	return out, nil
}

// apiRequests sums the manager's rest_client_requests_total (client-go's count of its API requests).
func apiRequests(addr string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	total := 0.0
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, "rest_client_requests_total{") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
