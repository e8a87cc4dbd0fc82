// Package oidcissuer is an OpenID Connect issuer for tests, served on loopback over TLS as a CI
// system's is (GitHub Actions: https://token.actions.githubusercontent.com; GitLab CI:
// https://gitlab.com): a discovery document at /.well-known/openid-configuration, the signing keys
// at its jwks_uri, and job tokens (JWTs signed RS256 with the current key, its kid in the header)
// with the claims a test gives, shaped like GitHub's or GitLab's (GitHubClaims, GitLabClaims). Keys
// rotate (Rotate: the old key stays published until Retire), the issuer can be taken down (Down),
// and tokens can be forged the ways an attacker would (alg none, HS256 with the public key,
// an unpublished key), so that a verifier's every refusal is tested against real signatures.
package oidcissuer

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// T is what the issuer needs of its caller: a test's testing.TB, or the benchmark's stand-in.
type T interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// Issuer is a running test issuer.
type Issuer struct {
	srv *httptest.Server
	// URL is the issuer identifier (https://127.0.0.1:port/path): the iss claim of its tokens.
	URL string
	// Now is the issuer's clock for iat, nbf and exp (time.Now when nil): a test whose verifier
	// runs on a clock of its own gives the issuer the same one.
	Now func() time.Time

	mu        sync.Mutex
	keys      []*rsa.PrivateKey // published; the last one signs
	kids      []string
	down      bool
	jwksFetch atomic.Int64
	seq       int
	forger    *rsa.PrivateKey // never published: TokenWithUnpublishedKey's
}

// Start serves an issuer at path (e.g. "/github") on a loopback TLS listener until the test ends.
func Start(t T, path string) *Issuer {
	t.Helper()
	is := &Issuer{}
	mux := http.NewServeMux()
	mux.HandleFunc(path+"/.well-known/openid-configuration", is.discovery)
	mux.HandleFunc(path+"/jwks", is.jwks)
	is.srv = httptest.NewTLSServer(mux)
	t.Cleanup(is.srv.Close)
	is.URL = is.srv.URL + path
	is.Rotate(t)
	return is
}

// Client is an HTTP client that trusts the certificates of the issuers (a verifier's, in tests).
func Client(issuers ...*Issuer) *http.Client {
	pool := x509.NewCertPool()
	for _, is := range issuers {
		pool.AddCert(is.srv.Certificate())
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

// CertPEM is the issuer's TLS certificate, PEM-encoded (for SSL_CERT_FILE of a process that
// fetches its keys).
func (is *Issuer) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: is.srv.Certificate().Raw})
}

// Rotate adds a new signing key: tokens are signed with it from now on; the older keys stay
// published until Retire.
func (is *Issuer) Rotate(t T) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	is.seq++
	is.keys = append(is.keys, k)
	is.kids = append(is.kids, fmt.Sprintf("key-%d", is.seq))
}

// Retire stops publishing every key but the current one.
func (is *Issuer) Retire() {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.keys, is.kids = is.keys[len(is.keys)-1:], is.kids[len(is.kids)-1:]
}

// Down makes the issuer answer 503 to every request (down true) or serve again.
func (is *Issuer) Down(down bool) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.down = down
}

// JWKSFetches is how many times the key set was asked for (answered or, while Down, not).
func (is *Issuer) JWKSFetches() int { return int(is.jwksFetch.Load()) }

func (is *Issuer) unavailable(w http.ResponseWriter) bool {
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.down {
		http.Error(w, "down for the test", http.StatusServiceUnavailable)
	}
	return is.down
}

func (is *Issuer) discovery(w http.ResponseWriter, _ *http.Request) {
	if is.unavailable(w) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"issuer":                                is.URL,
		"jwks_uri":                              is.URL + "/jwks",
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public", "pairwise"},
		"id_token_signing_alg_values_supported": []string{"RS256"},
		"claims_supported":                      []string{"sub", "aud", "exp", "iat", "iss", "jti", "nbf", "ref", "repository"},
	})
}

func (is *Issuer) jwks(w http.ResponseWriter, _ *http.Request) {
	is.jwksFetch.Add(1)
	if is.unavailable(w) {
		return
	}
	is.mu.Lock()
	set := jose.JSONWebKeySet{}
	for i, k := range is.keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.PublicKey, KeyID: is.kids[i], Algorithm: string(jose.RS256), Use: "sig"})
	}
	is.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(set)
}

// Claims are a token's claims; Token adds iss, iat, nbf, exp and jti where they are missing.
type Claims map[string]any

// GitHubClaims are the claims of a GitHub Actions job token for repo (owner/name), ref and event,
// for audience aud.
func GitHubClaims(aud, repo, ref, event string) Claims {
	owner, _, _ := strings.Cut(repo, "/")
	return Claims{
		"aud": aud, "sub": "repo:" + repo + ":ref:" + ref, "repository": repo, "repository_owner": owner,
		"ref": ref, "ref_type": "branch", "event_name": event, "workflow": "deploy",
		"job_workflow_ref": repo + "/.github/workflows/deploy.yml@" + ref, "run_id": "7", "actor": "octocat",
	}
}

// GitLabClaims are the claims of a GitLab CI id_token for project (group/name), ref and pipeline
// source, for audience aud.
func GitLabClaims(aud, project, ref, source string) Claims {
	group, _, _ := strings.Cut(project, "/")
	return Claims{
		"aud": aud, "sub": "project_path:" + project + ":ref_type:branch:ref:" + ref, "project_path": project,
		"namespace_path": group, "ref": ref, "ref_type": "branch", "ref_protected": "false",
		"pipeline_source": source, "pipeline_id": "11", "user_login": "gitlab-user",
	}
}

// Token signs claims with the current key (RS256, kid in the header). Times default to: issued now,
// valid for 10 minutes; a fresh jti each call.
func (is *Issuer) Token(t T, c Claims) string {
	t.Helper()
	is.mu.Lock()
	key, kid := is.keys[len(is.keys)-1], is.kids[len(is.kids)-1]
	is.mu.Unlock()
	return Sign(t, key, kid, is.complete(c))
}

// TokenWithUnpublishedKey is a token signed by a key the issuer never published, with a kid of its
// own (as a forger would make one). The forger's key is made once per issuer: an RSA key costs
// tens of milliseconds (seconds under -race on a busy machine), and the verifier cannot tell one
// unpublished key from another.
func (is *Issuer) TokenWithUnpublishedKey(t T, c Claims) string {
	t.Helper()
	is.mu.Lock()
	if is.forger == nil {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			is.mu.Unlock()
			t.Fatal(err)
		}
		is.forger = k
	}
	k := is.forger
	is.mu.Unlock()
	return Sign(t, k, "forged", is.complete(c))
}

// UnsignedToken is c with alg none (an empty signature).
func (is *Issuer) UnsignedToken(t T, c Claims) string {
	t.Helper()
	return encodeSegment(t, map[string]any{"alg": "none", "typ": "JWT"}) + "." + encodeSegment(t, is.complete(c)) + "."
}

// HMACToken is c signed HS256 with the current key's public key bytes as the secret: the
// algorithm confusion attack on verifiers that take the key's type from the token.
func (is *Issuer) HMACToken(t T, c Claims) string {
	t.Helper()
	is.mu.Lock()
	key, kid := is.keys[len(is.keys)-1], is.kids[len(is.kids)-1]
	is.mu.Unlock()
	secret := x509.MarshalPKCS1PublicKey(&key.PublicKey)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: secret}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		t.Fatal(err)
	}
	return sign(t, signer, is.complete(c))
}

func (is *Issuer) complete(c Claims) Claims {
	out := Claims{}
	for k, v := range c {
		out[k] = v
	}
	now := time.Now()
	if is.Now != nil {
		now = is.Now()
	}
	defaults := Claims{"iss": is.URL, "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(10 * time.Minute).Unix(), "jti": newJTI()}
	for k, v := range defaults {
		if _, ok := out[k]; !ok {
			out[k] = v
		}
	}
	for k, v := range out {
		if v == nil { // a claim set to nil is left out
			delete(out, k)
		}
	}
	return out
}

// Sign signs claims RS256 with key, kid in the header.
func Sign(t T, key *rsa.PrivateKey, kid string, c Claims) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		t.Fatal(err)
	}
	return sign(t, signer, c)
}

func sign(t T, signer jose.Signer, c Claims) string {
	t.Helper()
	payload, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	s, err := obj.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func encodeSegment(t T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func newJTI() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}
