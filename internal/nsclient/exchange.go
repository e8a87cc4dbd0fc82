package nsclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// Exchange is a keyless request: the job's identity token, presented at the namespaces
// controller's exchange, is the only credential (docs/namespaces.md, "Keyless pipelines").
type Exchange struct {
	// URL is the exchange's base URL (https://quartermaster.example.com); the path is added.
	URL   string
	Token string
	// CAFile, when set, is the only CA the exchange's certificate may chain to.
	CAFile         string
	TTL, TokenTTL  time.Duration // 0: what the TrustedIssuer's rule gives
	Timeout        time.Duration
	KubeconfigPath string
}

// RunExchange presents the token and writes the kubeconfig it gets. A refusal (the token, its
// claims, the name, the limit: 401, 403, 409) returns *Refused; an unavailable issuer, a timeout
// or a server error returns a plain error (exit 1: try again).
func RunExchange(ctx context.Context, x Exchange) (*Served, error) {
	client := &http.Client{Timeout: x.Timeout}
	if x.CAFile != "" {
		pem, err := os.ReadFile(x.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--exchange-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--exchange-ca-file %s holds no PEM certificate", x.CAFile)
		}
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	body := nsrequest.ExchangeRequest{}
	if x.TTL > 0 {
		body.TTL = x.TTL.String()
	}
	if x.TokenTTL > 0 {
		body.TokenTTL = x.TokenTTL.String()
	}
	b, _ := json.Marshal(body)
	url := strings.TrimSuffix(x.URL, "/") + nsrequest.ExchangePath
	if !strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("--exchange-url %s: the exchange is served over https only (the token is a credential)", x.URL)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(x.Token))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the exchange at %s: %w", url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("the exchange's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e nsrequest.ExchangeError
		if json.Unmarshal(raw, &e) != nil || e.Check == "" {
			return nil, fmt.Errorf("the exchange answered %s", resp.Status)
		}
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusConflict, http.StatusBadRequest:
			return nil, &Refused{Status: nsrequest.StatusInvalid, Reason: e.Check, Message: e.Message}
		}
		return nil, fmt.Errorf("the exchange answered %s (%s): %s", resp.Status, e.Check, e.Message)
	}
	var ok nsrequest.ExchangeResponse
	if err := json.Unmarshal(raw, &ok); err != nil || ok.Kubeconfig == "" {
		return nil, fmt.Errorf("the exchange's answer holds no kubeconfig")
	}
	if err := writeFile(x.KubeconfigPath, []byte(ok.Kubeconfig)); err != nil {
		return nil, err
	}
	return &Served{Namespace: ok.Namespace, TokenExpiresAt: ok.TokenExpiresAt}, nil
}
