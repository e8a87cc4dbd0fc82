package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsv1alpha1 "github.com/quartermaster-dev/quartermaster/api/namespaces/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/oidcissuer"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// keylessNamespaces is how many namespaces the memory case serves through the exchange.
const keylessNamespaces = 500

// keylessMemoryBench runs the manager binary as its own process with the exchange on and measures
// its resident memory: once started and warmed by one exchange, after 500 jobs got their
// namespaces through the exchange (each a verified token, a used-token record, a request, a
// namespace and its objects), and after 500 more namespaces requested as ConfigMaps by a stored
// credential. The two growths, in one process and one run, say what the keyless path costs per
// namespace beside the ConfigMap path (its token records and identity annotations, the verifier's
// cached keys).
func keylessMemoryBench(ctx context.Context, e *env) (results []result, err error) {
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
	const requestsNS = "bench-keyless-memory"
	if err := e.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: requestsNS}}); err != nil {
		return nil, err
	}
	gh := oidcissuer.Start(bt, "/github")
	dir, err := os.MkdirTemp("", "qm-bench-keyless-memory")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	certDir, issuerCA := filepath.Join(dir, "exchange-tls"), filepath.Join(dir, "issuer-ca.pem")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(issuerCA, gh.CertPEM(), 0o600); err != nil {
		return nil, err
	}
	pool := testenv.ServingCert(bt, certDir)
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	// The manager trusts the loopback issuer's certificate as it would a public CA's.
	p, err := startProcessWithEnv(e, []string{"SSL_CERT_FILE=" + issuerCA}, "--controllers=namespaces", "--requests-namespace="+requestsNS,
		"--namespace-defaults="+defaultsFile(), "--exchange-bind-address="+addr, "--exchange-cert-dir="+certDir)
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.stop() }()

	const aud = "https://quartermaster.bench"
	admin, err := client.New(e.cluster.Config, client.Options{Scheme: manager.Scheme(nsv1alpha1.AddToScheme)})
	if err != nil {
		return nil, err
	}
	if err := admin.Create(ctx, &nsv1alpha1.TrustedIssuer{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-memory-github"},
		Spec: nsv1alpha1.TrustedIssuerSpec{IssuerURL: gh.URL, Audience: aud, IdentityClaim: "repository",
			Rules: []nsv1alpha1.IssuerRule{{Name: "prs", Claims: map[string][]string{"repository": {"acme/*"}}, Namespace: "bm-{repository|last}-pr-{ref|pull}"}}},
	}); err != nil {
		return nil, err
	}
	defer func() {
		_ = admin.Delete(context.Background(), &nsv1alpha1.TrustedIssuer{ObjectMeta: metav1.ObjectMeta{Name: "bench-memory-github"}})
	}()
	tokens := make([]string, keylessNamespaces+1)
	for i := range tokens {
		tokens[i] = gh.Token(bt, oidcissuer.GitHubClaims(aud, fmt.Sprintf("acme/mem%03d", i), fmt.Sprintf("refs/pull/%d/merge", i), "pull_request"))
	}
	client := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 16,
	}}
	url := "https://" + addr + nsrequest.ExchangePath
	exchange := func(i int) error {
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
	}
	if err := waitAnswer(ctx, client, url); err != nil {
		return nil, fmt.Errorf("%w\nmanager logs:\n%s", err, p.logs.Tail(4000))
	}
	// One exchange warms the process (the issuer's keys fetched, the caches synced); not counted.
	if err := exchange(keylessNamespaces); err != nil {
		return nil, err
	}
	time.Sleep(idleWindow) // the process settles before its RSS is read
	rssIdle, err := p.rssMiB()
	if err != nil {
		return nil, err
	}
	if err := parallel(16, keylessNamespaces, exchange); err != nil {
		return nil, err
	}
	time.Sleep(idleWindow)
	rssKeyless, err := p.rssMiB()
	if err != nil {
		return nil, err
	}
	splitKeyless := p.rssSplit()
	if err := p.saveHeapProfile(fmt.Sprintf("namespaces-keyless-%d.heap", keylessNamespaces)); err != nil {
		return nil, err
	}
	if err := submitRequests(ctx, e, requestsNS, "bench-cm", keylessNamespaces); err != nil {
		return nil, err
	}
	if err := waitServed(ctx, e, requestsNS, 2*keylessNamespaces+1); err != nil {
		return nil, err
	}
	time.Sleep(idleWindow)
	rssBoth, err := p.rssMiB()
	if err != nil {
		return nil, err
	}
	if err := p.stop(); err != nil {
		return nil, err
	}
	keylessGrowth, cmGrowth := rssKeyless-rssIdle, rssBoth-rssKeyless
	return []result{
		{metric: "manager RSS, the exchange on, started and 1 namespace served through it", value: rssIdle, unit: "MiB"},
		{metric: fmt.Sprintf("manager RSS, %d more namespaces served through the exchange", keylessNamespaces), value: rssKeyless, unit: "MiB",
			note: fmt.Sprintf("growth %.1f MiB; %s", keylessGrowth, splitKeyless)},
		{metric: fmt.Sprintf("manager RSS, then %d namespaces requested as ConfigMaps", keylessNamespaces), value: rssBoth, unit: "MiB",
			note: fmt.Sprintf("growth %.1f MiB; keyless/ConfigMap growth ratio %.2f", cmGrowth, keylessGrowth/cmGrowth)},
	}, nil
}
