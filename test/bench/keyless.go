package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	nsv1alpha1 "github.com/quartermaster-dev/quartermaster/api/namespaces/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/namespaces"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/oidcissuer"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const keylessRequests = 200

// benchT is what the test helpers need of a test, for the benchmark: a failure panics (the case
// fails), cleanups run when the case ends.
type benchT struct{ cleanups []func() }

func (*benchT) Helper()           {}
func (*benchT) Fatal(args ...any) { panic(fmt.Sprint(args...)) }
func (b *benchT) Cleanup(f func()) {
	b.cleanups = append(b.cleanups, f)
}
func (b *benchT) done() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
}

// keylessBench measures the keyless path against the ConfigMap path in one run, on one manager:
// 200 jobs each exchange their own identity token (a loopback OIDC issuer signs them; every
// exchange verifies a signature, records the token, makes the request and waits for its
// kubeconfig), then 200 requests made as ConfigMaps by a pipeline holding a credential, each
// waited for until Ready; both with 16 at a time.
func keylessBench(ctx context.Context, e *env) (results []result, err error) {
	bt := &benchT{}
	defer bt.done()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	if err := installCRDs(ctx, e, "namespaces.quartermaster.dev_trustedissuers.yaml"); err != nil {
		return nil, err
	}
	const requestsNS = "bench-keyless"
	if err := e.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: requestsNS}}); err != nil {
		return nil, err
	}
	gh := oidcissuer.Start(bt, "/github")
	certDir, err := os.MkdirTemp("", "qm-bench-exchange")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(certDir)
	pool := testenv.ServingCert(bt, certDir)
	addr, err := freePort()
	if err != nil {
		return nil, err
	}

	o := &namespaces.Options{}
	reg := namespaces.ControllerOf(o)
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	reg.AddFlags(fs)
	if err := fs.Parse([]string{"--requests-namespace=" + requestsNS, "--namespace-defaults=" + defaultsFile(),
		"--exchange-bind-address=" + addr, "--exchange-cert-dir=" + certDir}); err != nil {
		return nil, err
	}
	o.ExchangeClient = oidcissuer.Client(gh)
	scheme := manager.Scheme(nsv1alpha1.AddToScheme)
	cacheOpts, _ := manager.CacheOptions([]controllers.Controller{reg})
	mgr, err := newManager(e.cluster.Config, ctrl.Options{Scheme: scheme, Cache: cacheOpts})
	if err != nil {
		return nil, err
	}
	if err := reg.Setup(mgr, nil); err != nil {
		return nil, err
	}
	stop, err := startManager(ctx, mgr, "namespaces")
	if err != nil {
		return nil, err
	}
	defer stop()

	const aud = "https://quartermaster.bench"
	admin := mgr.GetClient()
	if err := admin.Create(ctx, &nsv1alpha1.TrustedIssuer{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-github"},
		Spec: nsv1alpha1.TrustedIssuerSpec{IssuerURL: gh.URL, Audience: aud, IdentityClaim: "repository",
			Rules: []nsv1alpha1.IssuerRule{{Name: "prs", Claims: map[string][]string{"repository": {"acme/*"}}, Namespace: "bk-{repository|last}-pr-{ref|pull}"}}},
	}); err != nil {
		return nil, err
	}
	defer func() {
		_ = admin.Delete(context.Background(), &nsv1alpha1.TrustedIssuer{ObjectMeta: metav1.ObjectMeta{Name: "bench-github"}})
	}()

	// The jobs' tokens are minted before the clock starts (a CI system mints them, not the cluster).
	tokens := make([]string, keylessRequests)
	for i := range tokens {
		tokens[i] = gh.Token(bt, oidcissuer.GitHubClaims(aud, fmt.Sprintf("acme/svc%03d", i), fmt.Sprintf("refs/pull/%d/merge", i), "pull_request"))
	}
	client := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 16,
	}}
	url := "https://" + addr + nsrequest.ExchangePath
	// The exchange listens once the manager runs: wait for its first answer (a refusal).
	if err := waitAnswer(ctx, client, url); err != nil {
		return nil, err
	}

	start := time.Now()
	err = parallel(16, keylessRequests, func(i int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(`{}`))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+tokens[i])
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var out nsrequest.ExchangeResponse
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil || out.Kubeconfig == "" {
			return fmt.Errorf("exchange %d: %s %s", i, resp.Status, body)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	keyless := time.Since(start)

	start = time.Now()
	if err := submitRequests(ctx, e, requestsNS, "bench-cm", keylessRequests); err != nil {
		return nil, err
	}
	if err := waitServed(ctx, e, requestsNS, 2*keylessRequests); err != nil {
		return nil, err
	}
	configMaps := time.Since(start)
	return []result{
		{metric: fmt.Sprintf("%d jobs exchange their identity tokens, 16 at a time: requests served per second", keylessRequests),
			value: keylessRequests / keyless.Seconds(), unit: "requests/s", note: fmt.Sprintf("%.1f s, each answered with its kubeconfig", keyless.Seconds())},
		{metric: fmt.Sprintf("the same manager, %d ConfigMap requests by a stored credential", keylessRequests),
			value: keylessRequests / configMaps.Seconds(), unit: "requests/s",
			note: fmt.Sprintf("%.1f s; keyless/ConfigMap throughput ratio %.2f", configMaps.Seconds(), configMaps.Seconds()/keyless.Seconds())},
	}, nil
}

// waitAnswer waits until the exchange answers at all (it starts with the manager).
func waitAnswer(ctx context.Context, client *http.Client, url string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := client.Post(url, "application/json", nil)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("the exchange never answered"), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
