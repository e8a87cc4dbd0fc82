// Package pipelineid decides what a CI job may have from its OIDC identity token: it verifies the
// token against the issuers the platform trusts (go-oidc: the signature against the issuer's
// published keys, fetched through its discovery document, cached, fetched again — at most once per
// KeysRefetchEvery — for a token no cached key verifies; iss and aud; then exp, nbf and iat with a bounded clock skew), and maps its claims,
// through the first rule that admits them, to the one namespace name the job may ask for. It holds
// no Kubernetes client: the namespaces controller's exchange endpoint calls it.
//
// Every refusal is a *Refusal naming the check that failed; no message ever repeats the token.
package pipelineid

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"
)

// MaxTokenSize bounds the token read (GitHub's and GitLab's are 1–2 KB).
const MaxTokenSize = 16 << 10

// DefaultSkew is the clock skew allowed on exp, nbf and iat.
const DefaultSkew = time.Minute

// algorithms are the signature algorithms accepted: asymmetric ones only (never none, never an
// HMAC, whose "secret" a verifier confused about key types would take from the public key).
var algorithms = []string{
	oidc.RS256, oidc.RS384, oidc.RS512, oidc.ES256, oidc.ES384, oidc.ES512, oidc.PS256, oidc.PS384, oidc.PS512, oidc.EdDSA,
}

// Checks a token can fail, as Refusal.Check names them.
const (
	CheckFormat    = "format"    // not a signed JWT of an accepted algorithm
	CheckIssuer    = "issuer"    // no trusted issuer of that name, or its discovery failed
	CheckSignature = "signature" // no published key of the issuer verifies it
	CheckAudience  = "audience"  // not issued for this platform's audience
	CheckExpiry    = "exp"       // expired (or no exp)
	CheckNotBefore = "nbf"       // not valid yet
	CheckIssuedAt  = "iat"       // issued in the future
	CheckClaims    = "claims"    // no rule admits the claims, or one it needs is missing
	CheckName      = "name"      // the claims make no valid namespace name
)

// Refusal is a token refused by one check. Its message names the check and what was wrong, never
// the token.
type Refusal struct {
	Check   string
	Message string
	// Unavailable: the issuer could not be reached (the caller may retry later), as opposed to a
	// token that will never pass.
	Unavailable bool
}

func (r *Refusal) Error() string { return r.Check + ": " + r.Message }

func refuse(check, format string, args ...any) *Refusal {
	return &Refusal{Check: check, Message: fmt.Sprintf(format, args...)}
}

// Verified is a token that passed every check of its issuer.
type Verified struct {
	Issuer string
	// Claims are the token's claims as JSON values.
	Claims map[string]any
	// ID identifies the token for replay protection: its jti with its issuer, or a digest of the
	// token when it has no jti (hex SHA-256, never the token).
	ID     string
	Expiry time.Time
}

// Verifier verifies tokens of trusted issuers, keeping one go-oidc verifier (with its cached key
// set) per issuer and audience.
type Verifier struct {
	// Client fetches discovery documents and keys (a timeout, and the roots to trust).
	Client *http.Client
	// Skew is the clock skew allowed on exp, nbf and iat (DefaultSkew when zero).
	Skew time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu        sync.Mutex
	verifiers map[string]*keyed // by issuer URL and audience
}

// KeysRefresh is how old an issuer's cached keys (and discovery document) may grow before they are
// fetched again, so that a key the issuer stopped publishing stops verifying; KeysMaxAge is how
// long the cached ones keep serving while the issuer cannot be reached.
const (
	KeysRefresh = 5 * time.Minute
	KeysMaxAge  = time.Hour
)

// keyed is one issuer's go-oidc verifier and when its keys were first fetched.
type keyed struct {
	iv      *oidc.IDTokenVerifier
	fetched time.Time
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

// Verify checks raw against issuer (its URL and the audience tokens must name), which the caller
// chose by the token's unverified iss claim (Peek).
func (v *Verifier) Verify(ctx context.Context, raw, issuer, audience string) (*Verified, error) {
	if len(raw) > MaxTokenSize {
		return nil, refuse(CheckFormat, "the token is longer than %d bytes", MaxTokenSize)
	}
	iv, err := v.verifier(ctx, issuer, audience)
	if err != nil {
		return nil, err
	}
	tok, err := iv.Verify(ctx, raw)
	if err != nil {
		return nil, classify(issuer, audience, err)
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return nil, refuse(CheckFormat, "the claims are not a JSON object")
	}
	if err := v.checkTimes(claims); err != nil {
		return nil, err
	}
	out := &Verified{Issuer: issuer, Claims: claims, Expiry: tok.Expiry}
	if jti, ok := claims["jti"].(string); ok && jti != "" {
		out.ID = "jti:" + jti
	} else {
		// The digest of the decoded claims, not of the token's text: base64 has spare bits in its
		// last character and an ECDSA signature has a twin (s, n-s), so one signed token has many
		// texts that verify, and each would be a "new" token.
		payload, err := base64.RawURLEncoding.DecodeString(strings.Split(raw, ".")[1])
		if err != nil {
			return nil, refuse(CheckFormat, "the claims are not base64url")
		}
		sum := sha256.Sum256(payload)
		out.ID = "sha256:" + hex.EncodeToString(sum[:])
	}
	return out, nil
}

// verifier is the go-oidc verifier of issuer for audience, made (discovery fetched) on first use
// and again once its keys are KeysRefresh old (its key set fetches the keys again only for a token
// no cached key verifies, so a retired key would verify for ever). While the issuer cannot be reached,
// the cached keys serve until KeysMaxAge; a failed discovery is not kept: the next token tries
// again.
func (v *Verifier) verifier(ctx context.Context, issuer, audience string) (*oidc.IDTokenVerifier, error) {
	key := issuer + "\x00" + audience
	v.mu.Lock()
	cached := v.verifiers[key]
	v.mu.Unlock()
	now := v.now()
	if cached != nil && now.Sub(cached.fetched) < KeysRefresh {
		return cached.iv, nil
	}
	client := v.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	dctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, client), 15*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(dctx, issuer)
	switch {
	case err != nil && cached != nil && now.Sub(cached.fetched) < KeysMaxAge:
		return cached.iv, nil // the issuer is unreachable: its cached keys serve a while
	case err != nil:
		return nil, &Refusal{Check: CheckIssuer, Unavailable: true, Message: fmt.Sprintf("the discovery document of %s could not be read (%v); try again later", issuer, err)}
	}
	var d struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := p.Claims(&d); err != nil || d.JWKSURI == "" {
		return nil, &Refusal{Check: CheckIssuer, Unavailable: true, Message: fmt.Sprintf("the discovery document of %s names no jwks_uri; try again later", issuer)}
	}
	// The key set is ours (go-oidc's would fetch the keys again for every token no cached key
	// verifies: a flood of forged tokens would be a flood of requests to the issuer); it fetches
	// through the client too, in the context of the token's request.
	keys := newKeySet(d.JWKSURI, client, v.now)
	iv := oidc.NewVerifier(issuer, keys, &oidc.Config{
		ClientID: audience, SupportedSigningAlgs: algorithms,
		SkipExpiryCheck: true, // checkTimes checks exp, nbf and iat with the configured skew
	})
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.verifiers == nil {
		v.verifiers = map[string]*keyed{}
	}
	if kept := v.verifiers[key]; kept != nil && kept != cached {
		return kept.iv, nil // another token's discovery finished first: one key set per issuer
	}
	v.verifiers[key] = &keyed{iv: iv, fetched: now}
	return iv, nil
}

// classify turns go-oidc's errors into refusals naming the check (its messages name claims and
// algorithms, never the token).
func classify(issuer, audience string, err error) *Refusal {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "malformed jwt"), strings.Contains(msg, "not signed"), strings.Contains(msg, "multiple signatures"):
		return refuse(CheckFormat, "not a JWT signed with an accepted algorithm (%s): %s", strings.Join(algorithms, ", "), strings.TrimPrefix(msg, "oidc: "))
	case strings.Contains(msg, "expected audience"):
		return refuse(CheckAudience, "the token is not for audience %q (request it with that audience)", audience)
	case strings.Contains(msg, "issued by a different provider"):
		return refuse(CheckIssuer, "the token's iss is not %s", issuer)
	case strings.Contains(msg, errKeysFresh.Error()):
		return refuse(CheckSignature, "no key %s publishes verifies the token's signature (its %s)", issuer, errKeysFresh.Error())
	case strings.Contains(msg, "fetching keys"):
		return &Refusal{Check: CheckSignature, Unavailable: true, Message: fmt.Sprintf("the token's key is not among the cached keys of %s and they could not be fetched again (%s)", issuer, strings.TrimPrefix(msg, "oidc: "))}
	case strings.Contains(msg, "verify"):
		return refuse(CheckSignature, "no key %s publishes verifies the token's signature", issuer)
	}
	return refuse(CheckFormat, "%s", strings.TrimPrefix(msg, "oidc: "))
}

// checkTimes checks exp (required), nbf and iat against the clock with the skew.
func (v *Verifier) checkTimes(claims map[string]any) error {
	now := v.now()
	skew := v.Skew
	if skew == 0 {
		skew = DefaultSkew
	}
	exp, ok := numericDate(claims["exp"])
	if !ok {
		return refuse(CheckExpiry, "the token has no exp")
	}
	if now.Add(-skew).After(exp) {
		return refuse(CheckExpiry, "the token expired at %s", exp.UTC().Format(time.RFC3339))
	}
	if nbf, ok := numericDate(claims["nbf"]); ok && now.Add(skew).Before(nbf) {
		return refuse(CheckNotBefore, "the token is not valid before %s", nbf.UTC().Format(time.RFC3339))
	}
	if iat, ok := numericDate(claims["iat"]); ok && now.Add(skew).Before(iat) {
		return refuse(CheckIssuedAt, "the token was issued in the future (%s)", iat.UTC().Format(time.RFC3339))
	}
	return nil
}

func numericDate(v any) (time.Time, bool) {
	switch n := v.(type) {
	case float64:
		return time.Unix(int64(n), 0), true
	case json.Number:
		f, err := n.Float64()
		return time.Unix(int64(f), 0), err == nil
	}
	return time.Time{}, false
}

// Peek reads the token's iss claim without verifying anything, to choose which issuer verifies it.
// A token that is not a JWS of an accepted algorithm is refused here already.
func Peek(raw string) (issuer string, err error) {
	if len(raw) > MaxTokenSize {
		return "", refuse(CheckFormat, "the token is longer than %d bytes", MaxTokenSize)
	}
	algs := make([]jose.SignatureAlgorithm, len(algorithms))
	for i, a := range algorithms {
		algs[i] = jose.SignatureAlgorithm(a)
	}
	jws, err := jose.ParseSignedCompact(raw, algs)
	if err != nil {
		return "", refuse(CheckFormat, "not a JWT signed with an accepted algorithm (%s)", strings.Join(algorithms, ", "))
	}
	var c struct {
		Iss string `json:"iss"`
	}
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &c); err != nil || c.Iss == "" {
		return "", refuse(CheckFormat, "the token has no iss claim")
	}
	return c.Iss, nil
}

// Check reads issuer's discovery document and key set as a token's verification would, and
// returns how many keys it publishes: what a TrustedIssuer's status reports before any token
// comes. It does not touch the verifiers' cached keys.
func (v *Verifier) Check(ctx context.Context, issuer string) (int, error) {
	client := v.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, client), 15*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(ctx, issuer)
	if err != nil {
		return 0, fmt.Errorf("the discovery document: %w", err)
	}
	var d struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := p.Claims(&d); err != nil || d.JWKSURI == "" {
		return 0, errors.New("the discovery document names no jwks_uri")
	}
	set, err := fetchKeySet(ctx, client, d.JWKSURI)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range set.Keys {
		if k.Use == "" || k.Use == "sig" {
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("the key set at %s holds no signing key", d.JWKSURI)
	}
	return n, nil
}

// KeysRefetchEvery bounds how often an issuer's keys are fetched again for a token that no cached
// key verifies (signed with a key the issuer has just published, or forged): whatever the number
// of such tokens, at most one request per period goes to the issuer. In between such a token is
// refused for its signature: the keys were read moments ago, and issuers publish a key before they
// sign with it (a key published within the period verifies once it has passed).
const KeysRefetchEvery = 10 * time.Second

// keySet is an issuer's published keys as go-oidc's Verifier asks for them: fetched for the first
// token, cached, tried with go-oidc's StaticKeySet, and fetched again when none verifies, unless
// the last such attempt (or a failed first fetch) is less than KeysRefetchEvery old: then the
// token is refused for its signature, or as unavailable with the error of that attempt if it
// failed. One fetch at a time (a token waiting for it gives up with its request); the tokens that
// waited use what it read. A failed fetch keeps the keys there were.
type keySet struct {
	url    string
	client *http.Client
	now    func() time.Time
	fetch  chan struct{} // holds a token while a fetch runs

	mu        sync.Mutex
	keys      *oidc.StaticKeySet // nil before the first fetch that succeeded
	attempted time.Time          // the last fetch that counts against KeysRefetchEvery
	failed    error              // of that fetch, nil when it succeeded
}

func newKeySet(url string, client *http.Client, now func() time.Time) *keySet {
	return &keySet{url: url, client: client, now: now, fetch: make(chan struct{}, 1)}
}

// errKeysFresh is the refusal of a token no cached key verifies, the keys having been fetched
// again for such a token less than KeysRefetchEvery ago.
var errKeysFresh = errors.New("keys were fetched again less than " + KeysRefetchEvery.String() + " ago")

func (k *keySet) VerifySignature(ctx context.Context, jwt string) ([]byte, error) {
	k.mu.Lock()
	tried := k.keys
	k.mu.Unlock()
	if tried != nil {
		if payload, err := tried.VerifySignature(ctx, jwt); err == nil {
			return payload, nil
		}
	}
	keys, err := k.refetch(ctx, tried)
	if err != nil {
		return nil, err
	}
	return keys.VerifySignature(ctx, jwt)
}

// refetch returns keys newer than tried: fetched by another token meanwhile, or fetched now.
func (k *keySet) refetch(ctx context.Context, tried *oidc.StaticKeySet) (*oidc.StaticKeySet, error) {
	select {
	case k.fetch <- struct{}{}:
		defer func() { <-k.fetch }()
	case <-ctx.Done():
		return nil, fmt.Errorf("fetching keys: %w", ctx.Err())
	}
	k.mu.Lock()
	keys, attempted, failed := k.keys, k.attempted, k.failed
	k.mu.Unlock()
	if keys != tried {
		return keys, nil
	}
	if !attempted.IsZero() && k.now().Sub(attempted) < KeysRefetchEvery {
		if failed != nil {
			return nil, fmt.Errorf("fetching keys: %w (at %s; tried again %s later)", failed, attempted.UTC().Format(time.RFC3339), KeysRefetchEvery)
		}
		return nil, errKeysFresh
	}
	set, err := fetchKeySet(ctx, k.client, k.url)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil || tried != nil { // the first fetch, when it succeeds, does not count
		k.attempted = k.now()
	}
	k.failed = err
	if err != nil {
		return nil, fmt.Errorf("fetching keys: %w", err)
	}
	fresh := &oidc.StaticKeySet{}
	for _, key := range set.Keys {
		if key.Use != "" && key.Use != "sig" {
			continue
		}
		switch pub := key.Public().Key.(type) {
		case *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey: // what StaticKeySet verifies with; other keys are passed over
			fresh.PublicKeys = append(fresh.PublicKeys, pub)
		}
	}
	k.keys = fresh
	return fresh, nil
}

// fetchKeySet reads the JWK set at url (at most 1 MiB).
func fetchKeySet(ctx context.Context, client *http.Client, url string) (jose.JSONWebKeySet, error) {
	var set jose.JSONWebKeySet
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return set, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return set, fmt.Errorf("the keys at %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return set, fmt.Errorf("the keys at %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&set); err != nil {
		return set, fmt.Errorf("the keys at %s are no JWK set: %w", url, err)
	}
	return set, nil
}
