package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/testing/oidcissuer"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// helperT is what oidcissuer and testenv need of their caller, outside a test.
type helperT struct{ cleanups []func() }

func (*helperT) Helper()            {}
func (*helperT) Fatal(args ...any)  { fail(fmt.Errorf("%s", fmt.Sprint(args...))) }
func (h *helperT) Cleanup(f func()) { h.cleanups = append(h.cleanups, f) }

// runCIIssuer stands in for a CI system (GitHub Actions) until SIGTERM: its OIDC issuer on a
// loopback TLS port (discovery document and signing keys, as token.actions.githubusercontent.com
// serves them) and its token endpoint, which a job calls for its identity token as a GitHub job
// calls $ACTIONS_ID_TOKEN_REQUEST_URL: GET /token?audience=A&repository=R&ref=REF&event_name=E
// answers {"value": "<token>"}. Into DIR it writes issuer.url, ca.pem (the issuer's certificate,
// for the manager to trust), token.url, and exchange-tls/ (a serving certificate for 127.0.0.1,
// for the manager's exchange), then ready.
func runCIIssuer(dir string) error {
	h := &helperT{}
	defer func() {
		for i := len(h.cleanups) - 1; i >= 0; i-- {
			h.cleanups[i]()
		}
	}()
	if err := os.MkdirAll(filepath.Join(dir, "exchange-tls"), 0o700); err != nil {
		return err
	}
	issuer := oidcissuer.Start(h, "/github")
	testenv.ServingCert(h, filepath.Join(dir, "exchange-tls"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /token", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("audience") == "" || q.Get("repository") == "" || q.Get("ref") == "" || q.Get("event_name") == "" {
			http.Error(w, "audience, repository, ref and event_name are required", http.StatusBadRequest)
			return
		}
		token := issuer.Token(h, oidcissuer.GitHubClaims(q.Get("audience"), q.Get("repository"), q.Get("ref"), q.Get("event_name")))
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"count": len(token), "value": token})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	for name, content := range map[string][]byte{
		"issuer.url": []byte(issuer.URL + "\n"),
		"ca.pem":     issuer.CertPEM(),
		"token.url":  []byte("http://" + ln.Addr().String() + "/token\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), nil, 0o600); err != nil {
		return err
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	return nil
}
