package namespaces

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsv1alpha1 "github.com/quartermaster-dev/quartermaster/api/namespaces/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/nsclient"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/oidcissuer"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const exchangeAudience = "https://quartermaster.test"

// exchangeFixture is the namespaces controller with its exchange served on loopback, two CI
// issuers (GitHub- and GitLab-shaped) and their TrustedIssuers.
type exchangeFixture struct {
	*fixture
	github, gitlab *oidcissuer.Issuer
	url            string
	certDir        string // the exchange's tls.crt (self-signed: also its CA) and tls.key
	client         *http.Client
}

func startExchange(t *testing.T) *exchangeFixture {
	t.Helper()
	gh, gl := oidcissuer.Start(t, "/github"), oidcissuer.Start(t, "/gitlab")
	certDir := t.TempDir()
	pool := testenv.ServingCert(t, certDir)
	addr := make(chan net.Addr, 1)
	f := start(t, func(o *Options) {
		o.ExchangeAddress, o.ExchangeCertDir = "127.0.0.1:0", certDir
		o.ExchangeClient = oidcissuer.Client(gh, gl)
		o.exchangeListening = func(a net.Addr) { addr <- a }
		o.MaxTTL = 24 * time.Hour
	})
	x := &exchangeFixture{fixture: f, github: gh, gitlab: gl, certDir: certDir,
		client: &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}}
	select {
	case a := <-addr:
		x.url = "https://" + a.String() + nsrequest.ExchangePath
	case <-time.After(30 * time.Second):
		t.Fatal("the exchange did not start listening")
	}
	ctx := context.Background()
	must(t, f.c.Create(ctx, &nsv1alpha1.TrustedIssuer{
		ObjectMeta: metav1.ObjectMeta{Name: "github"},
		Spec: nsv1alpha1.TrustedIssuerSpec{
			IssuerURL: gh.URL, Audience: exchangeAudience, IdentityClaim: "repository", MaxNamespacesPerIdentity: ptr.To[int32](2),
			Rules: []nsv1alpha1.IssuerRule{
				{Name: "pull-requests", Claims: map[string][]string{"repository": {"acme/*"}, "event_name": {"pull_request"}},
					Namespace: "ci-{repository|last}-pr-{ref|pull}", TTL: &metav1.Duration{Duration: 2 * time.Hour}},
				{Name: "main", Claims: map[string][]string{"repository": {"acme/*"}, "ref": {"refs/heads/main"}},
					Namespace: "ci-{repository|last}-main"},
			},
		},
	}))
	must(t, f.c.Create(ctx, &nsv1alpha1.TrustedIssuer{
		ObjectMeta: metav1.ObjectMeta{Name: "gitlab"},
		Spec: nsv1alpha1.TrustedIssuerSpec{
			IssuerURL: gl.URL, Audience: exchangeAudience, IdentityClaim: "project_path",
			Rules: []nsv1alpha1.IssuerRule{{Name: "group", Claims: map[string][]string{"project_path": {"group/*"}}, Namespace: "gl-{project_path|last}-{ref|last}", Defaults: "small"}},
		},
	}))
	for _, name := range []string{"github", "gitlab"} {
		x.waitIssuer(t, name, ReasonIssuerReady)
	}
	return x
}

// waitIssuer waits for the TrustedIssuer's Ready reason and returns its condition's message.
func (x *exchangeFixture) waitIssuer(t *testing.T, name, reason string) string {
	t.Helper()
	ti := &nsv1alpha1.TrustedIssuer{}
	msg := ""
	eventually(t, "TrustedIssuer "+name+" "+reason, func() bool {
		if err := x.c.Get(context.Background(), client.ObjectKey{Name: name}, ti); err != nil {
			return false
		}
		for _, c := range ti.Status.Conditions {
			if c.Type == "Ready" && c.Reason == reason && c.ObservedGeneration == ti.Generation {
				msg = c.Message
				return true
			}
		}
		return false
	}, func() string { return fmt.Sprintf("%+v", ti.Status.Conditions) })
	return msg
}

// exchangeResult is one exchange's answer.
type exchangeResult struct {
	status int
	ok     nsrequest.ExchangeResponse
	err    nsrequest.ExchangeError
}

func (x *exchangeFixture) exchange(t *testing.T, token, body string) exchangeResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, x.url, bytes.NewBufferString(body))
	must(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := x.client.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := exchangeResult{status: resp.StatusCode}
	if resp.StatusCode == http.StatusOK {
		must(t, json.Unmarshal(b, &out.ok))
	} else if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		must(t, json.Unmarshal(b, &out.err))
	}
	if strings.Contains(string(b), token) && len(token) > 20 {
		t.Errorf("the answer repeats the token: %s", b)
	}
	return out
}

func (x *exchangeFixture) wantRefused(t *testing.T, r exchangeResult, status int, check, message string) {
	t.Helper()
	if r.status != status || r.err.Check != check || !strings.Contains(r.err.Message, message) {
		t.Errorf("got %d %+v; want %d, check %s, a message with %q", r.status, r.err, status, check, message)
	}
}

func TestExchange(t *testing.T) {
	t.Parallel()
	x := startExchange(t)
	ctx := context.Background()
	pr := func(repo string, n string) oidcissuer.Claims {
		return oidcissuer.GitHubClaims(exchangeAudience, repo, "refs/pull/"+n+"/merge", "pull_request")
	}

	var first nsrequest.ExchangeResponse
	t.Run("a GitHub job's token gets its pull request's namespace", func(t *testing.T) {
		tok := x.github.Token(t, pr("acme/web", "42"))
		r := x.exchange(t, tok, "")
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %+v", r.status, r.err)
		}
		first = r.ok
		if r.ok.Namespace != "ci-web-pr-42" || r.ok.ExpiresAt == "" || r.ok.TokenExpiresAt == "" {
			t.Errorf("answer = %+v", r.ok)
		}
		cfg, err := clientcmd.Load([]byte(r.ok.Kubeconfig))
		must(t, err)
		if ctxName := cfg.CurrentContext; cfg.Contexts[ctxName] == nil || cfg.Contexts[ctxName].Namespace != "ci-web-pr-42" {
			t.Errorf("kubeconfig context = %+v", cfg.Contexts[ctxName])
		}
		cm := &corev1.ConfigMap{}
		must(t, x.c.Get(ctx, client.ObjectKey{Namespace: x.rns, Name: "ci-web-pr-42"}, cm))
		if cm.Annotations[AnnotationIdentity] != "github:acme/web" || !strings.Contains(cm.Annotations[AnnotationIdentityClaims], `"ref":"refs/pull/42/merge"`) ||
			!strings.Contains(cm.Annotations[AnnotationIdentityClaims], `"workflow":"deploy"`) || cm.Data[nsrequest.DataTTL] != "2h0m0s" {
			t.Errorf("request = %+v / %+v", cm.Annotations, cm.Data)
		}
		ev := x.waitEvent(t, cm, "Exchanged")
		if !strings.Contains(ev.Note, "github:acme/web") || !strings.Contains(ev.Note, "rule pull-requests") {
			t.Errorf("Event = %q", ev.Note)
		}

		// The same token again: refused, whoever presents it.
		x.wantRefused(t, x.exchange(t, tok, ""), http.StatusConflict, "replay", "exchanged already")
	})

	t.Run("a re-run of the job gets the same namespace", func(t *testing.T) {
		r := x.exchange(t, x.github.Token(t, pr("acme/web", "42")), `{"tokenTTL": "30m"}`)
		if r.status != http.StatusOK || r.ok.Namespace != first.Namespace {
			t.Fatalf("status %d: %+v %+v", r.status, r.ok, r.err)
		}
	})

	t.Run("a GitLab job's token", func(t *testing.T) {
		r := x.exchange(t, x.gitlab.Token(t, oidcissuer.GitLabClaims(exchangeAudience, "group/api", "main", "push")), "")
		if r.status != http.StatusOK || r.ok.Namespace != "gl-api-main" {
			t.Fatalf("status %d: %+v %+v", r.status, r.ok, r.err)
		}
	})

	t.Run("a rule's defaults profile", func(t *testing.T) {
		// The GitLab rule names profile small: a quota of its own, and nothing of the top level.
		cm := &corev1.ConfigMap{}
		must(t, x.c.Get(ctx, client.ObjectKey{Namespace: x.rns, Name: "gl-api-main"}, cm))
		if cm.Annotations[nsrequest.AnnotationDefaults] != "small" {
			t.Errorf("request annotations = %v", cm.Annotations)
		}
		quota := &corev1.ResourceQuota{}
		must(t, x.c.Get(ctx, client.ObjectKey{Namespace: "gl-api-main", Name: nsrequest.DefaultsObjectsName}, quota))
		if got := quota.Spec.Hard[corev1.ResourcePods]; got.String() != "5" || len(quota.Spec.Hard) != 1 {
			t.Errorf("quota = %v, want the profile's pods: 5 alone", quota.Spec.Hard)
		}
		for _, obj := range []client.Object{&corev1.LimitRange{}, &networkingv1.NetworkPolicy{}} {
			if err := x.c.Get(ctx, client.ObjectKey{Namespace: "gl-api-main", Name: nsrequest.DefaultsObjectsName}, obj); !apierrors.IsNotFound(err) {
				t.Errorf("%T of the top level in a namespace of profile small: %v", obj, err)
			}
		}

		// A rule naming a profile the defaults lack: the issuer says so, and the exchange refuses
		// without using the token up (the platform's mistake, not the job's).
		ti := &nsv1alpha1.TrustedIssuer{}
		must(t, x.c.Get(ctx, client.ObjectKey{Name: "gitlab"}, ti))
		ti.Spec.Rules[0].Defaults = "huge"
		must(t, x.c.Update(ctx, ti))
		if msg := x.waitIssuer(t, "gitlab", ReasonUnknownDefaults); !strings.Contains(msg, `profile "huge" is not defined`) || !strings.Contains(msg, "profiles: small") {
			t.Errorf("issuer message = %q", msg)
		}
		tok := x.gitlab.Token(t, oidcissuer.GitLabClaims(exchangeAudience, "group/docs", "main", "push"))
		x.wantRefused(t, x.exchange(t, tok, ""), http.StatusServiceUnavailable, "defaults", `rule group: defaults profile "huge" is not defined`)
		must(t, x.c.Get(ctx, client.ObjectKey{Name: "gitlab"}, ti))
		ti.Spec.Rules[0].Defaults = "small"
		must(t, x.c.Update(ctx, ti))
		x.waitIssuer(t, "gitlab", ReasonIssuerReady)
		if r := x.exchange(t, tok, ""); r.status != http.StatusOK || r.ok.Namespace != "gl-docs-main" {
			t.Errorf("the same token once the rule is right: %d %+v", r.status, r.err)
		}

		// A request whose profile went from the defaults file is Invalid, naming it.
		must(t, x.c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: x.rns, Name: "direct-huge",
			Annotations: map[string]string{nsrequest.AnnotationDefaults: "huge"}}}))
		got := x.waitStatus(t, "direct-huge", nsrequest.StatusInvalid)
		if got.Annotations[nsrequest.AnnotationReason] != ReasonUnknownDefaults || !strings.Contains(got.Annotations[nsrequest.AnnotationMessage], `"huge"`) {
			t.Errorf("status = %v", got.Annotations)
		}
	})

	t.Run("another identity cannot take the namespace its claims also name", func(t *testing.T) {
		// acme/Web's pull request 42 makes the same name with this issuer's template.
		c := pr("acme/web", "42")
		c["repository"] = "acme/Web" // another repository whose name maps alike
		tok := x.github.Token(t, c)
		x.wantRefused(t, x.exchange(t, tok, ""), http.StatusForbidden, "held", "held by another identity (its request")
		// Refused, it handed out nothing: the token is not used up (presented again, it is refused
		// for what it asks, not as a replay).
		r := x.exchange(t, tok, "")
		x.wantRefused(t, r, http.StatusForbidden, "held", "the token is not used up")
	})

	t.Run("an identity holds at most its limit", func(t *testing.T) {
		r := x.exchange(t, x.github.Token(t, oidcissuer.GitHubClaims(exchangeAudience, "acme/web", "refs/heads/main", "push")), "")
		if r.status != http.StatusOK || r.ok.Namespace != "ci-web-main" {
			t.Fatalf("status %d: %+v %+v", r.status, r.ok, r.err)
		}
		x.wantRefused(t, x.exchange(t, x.github.Token(t, pr("acme/web", "43")), ""), http.StatusForbidden, "limit", "the oldest is ci-web-pr-42")

		// Two jobs of the identity exchanging at the same moment (on two replicas) both passed the
		// cached count: the recount from the API server withdraws the newer one.
		late := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: x.rns, Name: "ci-web-pr-44",
			Labels:      map[string]string{LabelIdentity: identityLabel("github:acme/web")},
			Annotations: map[string]string{AnnotationIdentity: "github:acme/web", AnnotationRequestedAt: time.Now().UTC().Add(time.Hour).Format("2006-01-02T15:04:05.000000000Z07:00")}}}
		must(t, x.c.Create(ctx, late))
		e := &exchanger{client: x.c, apiReader: x.c, policy: &nsrequest.Policy{RequestsNamespace: x.rns}}
		ti := &nsv1alpha1.TrustedIssuer{}
		must(t, x.c.Get(ctx, client.ObjectKey{Name: "github"}, ti))
		main := &corev1.ConfigMap{}
		must(t, x.c.Get(ctx, client.ObjectKey{Namespace: x.rns, Name: "ci-web-main"}, main))
		if ref := e.withinLimit(ctx, ti, main, "github:acme/web", identityLabel("github:acme/web"), 2); ref != nil {
			t.Errorf("the older request was withdrawn: %+v", ref)
		}
		ref := e.withinLimit(ctx, ti, late, "github:acme/web", identityLabel("github:acme/web"), 2)
		if ref == nil || ref.Check != "limit" || !strings.Contains(ref.Message, "at the same moment") || !strings.Contains(ref.Message, "the oldest is ci-web-pr-42") {
			t.Errorf("the newer request over the limit: %+v", ref)
		}
		if err := x.c.Get(ctx, client.ObjectKeyFromObject(late), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
			t.Errorf("the withdrawn request is still there: %v", err)
		}
	})

	t.Run("the request command's keyless path", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "kubeconfig")
		tok := x.gitlab.Token(t, oidcissuer.GitLabClaims(exchangeAudience, "group/cli", "main", "push"))
		run := func() (*nsclient.Served, error) {
			return nsclient.RunExchange(ctx, nsclient.Exchange{
				URL: strings.TrimSuffix(x.url, nsrequest.ExchangePath), Token: tok, CAFile: filepath.Join(x.certDir, "tls.crt"),
				TTL: time.Hour, Timeout: time.Minute, KubeconfigPath: out,
			})
		}
		served, err := run()
		if err != nil || served.Namespace != "gl-cli-main" {
			t.Fatalf("served %+v, %v", served, err)
		}
		if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("kubeconfig file: %v, %v", fi, err)
		}
		var refused *nsclient.Refused
		if _, err := run(); !errors.As(err, &refused) || refused.Reason != "replay" || refused.ExitCode() != 2 {
			t.Errorf("the same token again: %v, want a refusal (exit 2) by replay", err)
		}
	})

	t.Run("refusals name the check, never the token", func(t *testing.T) {
		now := time.Now()
		with := func(change func(oidcissuer.Claims)) oidcissuer.Claims {
			c := pr("acme/api", "7")
			change(c)
			return c
		}
		x.wantRefused(t, x.exchange(t, "", ""), http.StatusUnauthorized, "token", "Authorization: Bearer")
		x.wantRefused(t, x.exchange(t, x.github.Token(t, with(func(c oidcissuer.Claims) { c["exp"] = now.Add(-5 * time.Minute).Unix() })), ""), http.StatusUnauthorized, "exp", "expired")
		x.wantRefused(t, x.exchange(t, x.github.Token(t, with(func(c oidcissuer.Claims) { c["nbf"] = now.Add(5 * time.Minute).Unix() })), ""), http.StatusUnauthorized, "nbf", "not valid before")
		x.wantRefused(t, x.exchange(t, x.github.Token(t, with(func(c oidcissuer.Claims) { c["aud"] = "sts.amazonaws.com" })), ""), http.StatusUnauthorized, "audience", exchangeAudience)
		x.wantRefused(t, x.exchange(t, x.github.TokenWithUnpublishedKey(t, pr("acme/api", "7")), ""), http.StatusUnauthorized, "signature", "no key")
		x.wantRefused(t, x.exchange(t, x.github.UnsignedToken(t, pr("acme/api", "7")), ""), http.StatusUnauthorized, "format", "accepted algorithm")
		x.wantRefused(t, x.exchange(t, x.github.HMACToken(t, pr("acme/api", "7")), ""), http.StatusUnauthorized, "format", "accepted algorithm")
		x.wantRefused(t, x.exchange(t, x.github.Token(t, with(func(c oidcissuer.Claims) { c["iss"] = "https://token.example.com" })), ""), http.StatusUnauthorized, "issuer", "not trusted here")
		x.wantRefused(t, x.exchange(t, x.github.Token(t, with(func(c oidcissuer.Claims) { c["repository"] = "evil/api" })), ""), http.StatusForbidden, "claims", `repository="evil/api"`)
		x.wantRefused(t, x.exchange(t, x.github.Token(t, with(func(c oidcissuer.Claims) { c["repository"] = nil })), ""), http.StatusForbidden, "claims", "no repository claim")
		x.wantRefused(t, x.exchange(t, x.github.Token(t, with(func(c oidcissuer.Claims) { c["repository"] = "acme/" + strings.Repeat("x", 60) })), ""), http.StatusForbidden, "name", "never cut")
		x.wantRefused(t, x.exchange(t, x.github.Token(t, pr("acme/api", "7")), `{"ttl": "3h"}`), http.StatusForbidden, "body", "more than rule pull-requests allows")
		x.wantRefused(t, x.exchange(t, x.github.Token(t, pr("acme/api", "7")), `{"ttl": 3}`), http.StatusBadRequest, "body", "must be JSON")

		// An oversized token never reaches the verifier: the server's header bound answers.
		req, _ := http.NewRequest(http.MethodPost, x.url, nil)
		req.Header.Set("Authorization", "Bearer "+strings.Repeat("a", 64<<10))
		resp, err := x.client.Do(req)
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("a 64 KiB token: %d", resp.StatusCode)
		}
		// The GitLab issuer down, its keys never fetched since its first token... are cached: a new key is not.
		x.gitlab.Down(true)
		x.gitlab.Rotate(t)
		r := x.exchange(t, x.gitlab.Token(t, oidcissuer.GitLabClaims(exchangeAudience, "group/web", "main", "push")), "")
		x.wantRefused(t, r, http.StatusServiceUnavailable, "signature", "could not be fetched")
		x.gitlab.Down(false)
	})

	t.Run("a TrustedIssuer's status says whether its tokens can be verified", func(t *testing.T) {
		if msg := x.waitIssuer(t, "github", ReasonIssuerReady); !strings.Contains(msg, "1 signing keys published") {
			t.Errorf("Ready message = %q", msg)
		}
		must(t, x.c.Create(ctx, &nsv1alpha1.TrustedIssuer{
			ObjectMeta: metav1.ObjectMeta{Name: "nowhere"},
			Spec: nsv1alpha1.TrustedIssuerSpec{IssuerURL: "https://127.0.0.1:1/none", Audience: exchangeAudience, IdentityClaim: "sub",
				Rules: []nsv1alpha1.IssuerRule{{Name: "all", Claims: map[string][]string{"sub": {"*"}}, Namespace: "x-{sub}"}}},
		}))
		if msg := x.waitIssuer(t, "nowhere", ReasonIssuerUnreachable); !strings.Contains(msg, "cannot be verified") {
			t.Errorf("unreachable: %q", msg)
		}
		dup := &nsv1alpha1.TrustedIssuer{ObjectMeta: metav1.ObjectMeta{Name: "github-again"}}
		orig := &nsv1alpha1.TrustedIssuer{}
		must(t, x.c.Get(ctx, client.ObjectKey{Name: "github"}, orig))
		dup.Spec = orig.Spec
		must(t, x.c.Create(ctx, dup))
		if msg := x.waitIssuer(t, "github-again", ReasonDuplicateIssuer); !strings.Contains(msg, "TrustedIssuer github already names") {
			t.Errorf("duplicate: %q", msg)
		}
	})

	t.Run("records of used tokens go once the tokens expired", func(t *testing.T) {
		var leases coordinationv1.LeaseList
		must(t, x.c.List(ctx, &leases, client.InNamespace(x.rns), client.MatchingLabels{LabelUsedToken: "true"}))
		if len(leases.Items) < 4 {
			t.Fatalf("%d records of used tokens, want one per exchanged token", len(leases.Items))
		}
		s := &usedTokenSweeper{client: x.c, namespace: x.rns, now: time.Now}
		must(t, s.sweep(ctx))
		must(t, x.c.List(ctx, &leases, client.InNamespace(x.rns), client.MatchingLabels{LabelUsedToken: "true"}))
		kept := len(leases.Items)
		s.now = func() time.Time { return time.Now().Add(20 * time.Minute) }
		must(t, s.sweep(ctx))
		must(t, x.c.List(ctx, &leases, client.InNamespace(x.rns), client.MatchingLabels{LabelUsedToken: "true"}))
		if kept < 4 || len(leases.Items) != 0 {
			t.Errorf("records: %d kept while valid, %d left after expiry", kept, len(leases.Items))
		}
	})
}

// TestTrustedIssuerValidation: the API server refuses a TrustedIssuer that could never work, each
// with a message naming the field.
func TestTrustedIssuerValidation(t *testing.T) {
	t.Parallel()
	valid := func() *nsv1alpha1.TrustedIssuer {
		return &nsv1alpha1.TrustedIssuer{
			// Not TestExchange's github: a dry run of a name taken is refused as such.
			ObjectMeta: metav1.ObjectMeta{Name: "validated"},
			Spec: nsv1alpha1.TrustedIssuerSpec{
				IssuerURL: "https://token.actions.githubusercontent.com", Audience: "https://quartermaster.example.com", IdentityClaim: "repository",
				Rules: []nsv1alpha1.IssuerRule{{Name: "prs", Claims: map[string][]string{"repository": {"acme/*"}}, Namespace: "ci-{repository|last}-pr-{ref|pull}"}},
			},
		}
	}
	for _, c := range []struct {
		name   string
		change func(*nsv1alpha1.TrustedIssuer)
		reject string
	}{
		{name: "valid", change: func(*nsv1alpha1.TrustedIssuer) {}},
		{name: "http issuer", change: func(ti *nsv1alpha1.TrustedIssuer) { ti.Spec.IssuerURL = "http://token.example.com" }, reject: "spec.issuerURL in body should match"},
		{name: "no audience", change: func(ti *nsv1alpha1.TrustedIssuer) { ti.Spec.Audience = "" }, reject: "spec.audience"},
		{name: "no rules", change: func(ti *nsv1alpha1.TrustedIssuer) { ti.Spec.Rules = nil }, reject: "spec.rules"},
		{name: "a rule without claims", change: func(ti *nsv1alpha1.TrustedIssuer) { ti.Spec.Rules[0].Claims = map[string][]string{} }, reject: "spec.rules[0].claims"},
		{name: "a claim without patterns", change: func(ti *nsv1alpha1.TrustedIssuer) { ti.Spec.Rules[0].Claims["ref"] = []string{} }, reject: "each claim needs 1 to 32 patterns"},
		{name: "an unknown transform", change: func(ti *nsv1alpha1.TrustedIssuer) { ti.Spec.Rules[0].Namespace = "ci-{ref|upper}" }, reject: "spec.rules[0].namespace in body should match"},
		{name: "upper case text", change: func(ti *nsv1alpha1.TrustedIssuer) { ti.Spec.Rules[0].Namespace = "CI-{ref}" }, reject: "spec.rules[0].namespace in body should match"},
		{name: "limit zero", change: func(ti *nsv1alpha1.TrustedIssuer) { ti.Spec.MaxNamespacesPerIdentity = ptr.To[int32](0) }, reject: "spec.maxNamespacesPerIdentity"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ti := valid()
			c.change(ti)
			err := env.Client.Create(context.Background(), ti, client.DryRunAll)
			if c.reject == "" {
				must(t, err)
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.reject) {
				t.Errorf("got %v; want a refusal naming %q", err, c.reject)
			}
		})
	}
}
