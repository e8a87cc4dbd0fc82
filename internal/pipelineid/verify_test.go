package pipelineid

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/testing/oidcissuer"
)

const aud = "https://quartermaster.example.com"

// refusedBy asserts err is a refusal by check, and that its message does not hold the token; it
// returns the refusal (a copy).
func refusedBy(t *testing.T, err error, check, token string) Refusal {
	t.Helper()
	var r *Refusal
	if !errors.As(err, &r) {
		t.Fatalf("got %v, want a refusal by %s", err, check)
	}
	if r.Check != check {
		t.Errorf("refused by %s (%s), want %s", r.Check, r.Message, check)
	}
	for _, part := range strings.Split(token, ".") {
		if len(part) > 16 && strings.Contains(r.Error(), part) {
			t.Errorf("the refusal repeats the token: %s", r.Error())
		}
	}
	return *r
}

func TestVerifyAcceptsTheIssuersTokens(t *testing.T) {
	gh, gl := oidcissuer.Start(t, "/github"), oidcissuer.Start(t, "/gitlab")
	v := &Verifier{Client: oidcissuer.Client(gh, gl)}
	ctx := context.Background()

	tok := gh.Token(t, oidcissuer.GitHubClaims(aud, "acme/web", "refs/pull/42/merge", "pull_request"))
	iss, err := Peek(tok)
	if err != nil || iss != gh.URL {
		t.Fatalf("Peek = %q, %v; want %s", iss, err, gh.URL)
	}
	got, err := v.Verify(ctx, tok, gh.URL, aud)
	if err != nil {
		t.Fatal(err)
	}
	if got.Claims["repository"] != "acme/web" || !strings.HasPrefix(got.ID, "jti:") || got.Issuer != gh.URL || time.Until(got.Expiry) < 9*time.Minute {
		t.Errorf("verified = %+v", got)
	}

	// A second issuer beside the first (its own key set).
	gltok := gl.Token(t, oidcissuer.GitLabClaims(aud, "acme/api", "main", "push"))
	if got, err := v.Verify(ctx, gltok, gl.URL, aud); err != nil || got.Claims["project_path"] != "acme/api" {
		t.Fatalf("GitLab token: %+v, %v", got, err)
	}

	// No jti: the token's digest identifies it.
	v2 := &Verifier{Client: oidcissuer.Client(gh)}
	c := oidcissuer.GitHubClaims(aud, "acme/web", "refs/heads/main", "push")
	c["jti"] = nil
	nojti := gh.Token(t, c)
	first, err := v2.Verify(ctx, nojti, gh.URL, aud)
	if err != nil || !strings.HasPrefix(first.ID, "sha256:") {
		t.Fatalf("a token without jti: %+v, %v", first, err)
	}
	// Another text of the same signed token (the signature's last base64 character differs in its
	// spare bits only, which decode to the same bytes): it verifies, and it is the same token.
	parts := strings.Split(nojti, ".")
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	twin := ""
	for _, ch := range alphabet {
		other := parts[2][:len(parts[2])-1] + string(ch)
		if b, err := base64.RawURLEncoding.DecodeString(other); err == nil && other != parts[2] && bytes.Equal(b, sig) {
			twin = parts[0] + "." + parts[1] + "." + other
			break
		}
	}
	if twin == "" {
		t.Fatalf("the signature (%d bytes) has no spare bits in its last character", len(sig))
	}
	if got, err := v2.Verify(ctx, twin, gh.URL, aud); err != nil || got.ID != first.ID {
		t.Errorf("the token's twin text: %+v, %v; want it verified with ID %s (one token, one use)", got, err, first.ID)
	}
}

func TestVerifyRefusals(t *testing.T) {
	gh := oidcissuer.Start(t, "/github")
	other := oidcissuer.Start(t, "/other")
	v := &Verifier{Client: oidcissuer.Client(gh, other)}
	ctx := context.Background()
	claims := func(change func(oidcissuer.Claims)) oidcissuer.Claims {
		c := oidcissuer.GitHubClaims(aud, "acme/web", "refs/heads/main", "push")
		if change != nil {
			change(c)
		}
		return c
	}
	now := time.Now()
	cases := []struct {
		name, token, check string
	}{
		{"expired", gh.Token(t, claims(func(c oidcissuer.Claims) { c["exp"] = now.Add(-2 * time.Minute).Unix() })), CheckExpiry},
		{"without exp", gh.Token(t, claims(func(c oidcissuer.Claims) { c["exp"] = nil })), CheckExpiry},
		{"not valid yet", gh.Token(t, claims(func(c oidcissuer.Claims) { c["nbf"] = now.Add(5 * time.Minute).Unix() })), CheckNotBefore},
		{"issued in the future", gh.Token(t, claims(func(c oidcissuer.Claims) { c["iat"] = now.Add(5 * time.Minute).Unix() })), CheckIssuedAt},
		{"another audience", gh.Token(t, claims(func(c oidcissuer.Claims) { c["aud"] = "sts.amazonaws.com" })), CheckAudience},
		{"another issuer's token", other.Token(t, claims(nil)), CheckSignature},
		{"iss of another issuer, signed by this one", gh.Token(t, claims(func(c oidcissuer.Claims) { c["iss"] = other.URL })), CheckIssuer},
		{"an unpublished key", gh.TokenWithUnpublishedKey(t, claims(nil)), CheckSignature},
		{"alg none", gh.UnsignedToken(t, claims(nil)), CheckFormat},
		{"HS256 with the public key as secret", gh.HMACToken(t, claims(nil)), CheckFormat},
		{"oversized", gh.Token(t, claims(func(c oidcissuer.Claims) { c["pad"] = strings.Repeat("x", MaxTokenSize) })), CheckFormat},
		{"not a JWT", "hello.world", CheckFormat},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := v.Verify(ctx, c.token, gh.URL, aud)
			r := refusedBy(t, err, c.check, c.token)
			if r.Unavailable {
				t.Errorf("%s marked unavailable", r.Error())
			}
		})
	}
	t.Run("within the skew", func(t *testing.T) {
		tok := gh.Token(t, claims(func(c oidcissuer.Claims) {
			c["exp"], c["nbf"], c["iat"] = now.Add(-30*time.Second).Unix(), now.Add(30*time.Second).Unix(), now.Add(30*time.Second).Unix()
		}))
		if _, err := v.Verify(ctx, tok, gh.URL, aud); err != nil {
			t.Error(err)
		}
	})
	t.Run("Peek refuses what is no signed JWT", func(t *testing.T) {
		for _, tok := range []string{gh.UnsignedToken(t, claims(nil)), gh.HMACToken(t, claims(nil)), "a.b.c", strings.Repeat("a", MaxTokenSize+1)} {
			_, err := Peek(tok)
			refusedBy(t, err, CheckFormat, tok)
		}
	})
}

func TestKeysRotateAndTheIssuerGoesAway(t *testing.T) {
	gh, gl := oidcissuer.Start(t, "/github"), oidcissuer.Start(t, "/gitlab")
	clock := newTestClock(gh, gl)
	v := &Verifier{Client: oidcissuer.Client(gh, gl), Now: clock.Now}
	ctx := context.Background()
	long := func() oidcissuer.Claims {
		c := oidcissuer.GitHubClaims(aud, "acme/web", "refs/heads/main", "push")
		c["exp"] = clock.Now().Add(3 * time.Hour).Unix()
		return c
	}
	old := gh.Token(t, long())
	if _, err := v.Verify(ctx, old, gh.URL, aud); err != nil {
		t.Fatal(err)
	}
	fetches := gh.JWKSFetches()

	// A new key: its first token fetches the keys again (the last fetch being KeysRefetchEvery
	// old); both keys verify.
	gh.Rotate(t)
	rotated := gh.Token(t, long())
	if _, err := v.Verify(ctx, rotated, gh.URL, aud); err != nil {
		t.Fatalf("a token of the new key: %v", err)
	}
	if gh.JWKSFetches() != fetches+1 {
		t.Errorf("keys fetched %d times for the new key, want once", gh.JWKSFetches()-fetches)
	}
	if _, err := v.Verify(ctx, old, gh.URL, aud); err != nil {
		t.Errorf("the old key is still published: %v", err)
	}

	// The old key retired: once the keys are refreshed, its tokens stop verifying.
	gh.Retire()
	clock.Advance(KeysRefresh + time.Second)
	refusedBy(t, second(v.Verify(ctx, old, gh.URL, aud)), CheckSignature, old)
	if _, err := v.Verify(ctx, rotated, gh.URL, aud); err != nil {
		t.Errorf("the current key after the refresh: %v", err)
	}

	// The issuer goes away: the cached keys serve until KeysMaxAge, then a clear error.
	gh.Down(true)
	clock.Advance(KeysRefresh + time.Second)
	if _, err := v.Verify(ctx, rotated, gh.URL, aud); err != nil {
		t.Errorf("cached keys while the issuer is down: %v", err)
	}
	unknown := gh.TokenWithUnpublishedKey(t, long())
	clock.Advance(KeysRefetchEvery)
	if r := refusedBy(t, second(v.Verify(ctx, unknown, gh.URL, aud)), CheckSignature, unknown); !r.Unavailable {
		t.Errorf("an unknown key while the issuer is down: %v, want it said unavailable", r.Error())
	}
	clock.Advance(KeysMaxAge)
	r := refusedBy(t, second(v.Verify(ctx, rotated, gh.URL, aud)), CheckIssuer, rotated)
	if !r.Unavailable || !strings.Contains(r.Message, "could not be read") {
		t.Errorf("after KeysMaxAge with the issuer down: %v", r.Error())
	}
	gh.Down(false)
	if _, err := v.Verify(ctx, rotated, gh.URL, aud); err != nil {
		t.Errorf("the issuer back: %v", err)
	}

	// An issuer never reached is unavailable, not a bad token.
	gl.Down(true)
	tok := gl.Token(t, oidcissuer.GitLabClaims(aud, "acme/api", "main", "push"))
	if r := refusedBy(t, second(v.Verify(ctx, tok, gl.URL, aud)), CheckIssuer, tok); !r.Unavailable {
		t.Errorf("an issuer that is down: %v", r.Error())
	}
}

func second[T any](_ T, err error) error { return err }

// testClock stands still until the test advances it. The verifier and the issuers read the same
// one: an issuer on the machine's clock signs tokens whose nbf and iat run ahead of a clock that
// stands still, and a slow machine (this test once ran 148 s under load) saw them refused "not
// valid before"; a clock that ran with real time would let a slow machine pass a refetch period
// between two floods. Time here moves only when the test says so.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock(issuers ...*oidcissuer.Issuer) *testClock {
	c := &testClock{now: time.Now()}
	for _, is := range issuers {
		is.Now = c.Now
	}
	return c
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestForgedTokensDoNotFloodTheIssuer: tokens no published key verifies (forged, or of a key the
// issuer has not published) make at most one key set request per KeysRefetchEvery, however many
// come at once; they are refused for their signature in between; a key the issuer then publishes
// verifies once the period has passed.
func TestForgedTokensDoNotFloodTheIssuer(t *testing.T) {
	gh := oidcissuer.Start(t, "/github")
	clock := newTestClock(gh)
	advance := clock.Advance
	v := &Verifier{Client: oidcissuer.Client(gh), Now: clock.Now}
	ctx := context.Background()
	claims := func() oidcissuer.Claims { return oidcissuer.GitHubClaims(aud, "acme/web", "refs/heads/main", "push") }
	if _, err := v.Verify(ctx, gh.Token(t, claims()), gh.URL, aud); err != nil {
		t.Fatal(err)
	}
	flood := func(unavailable bool) (fetches int) {
		t.Helper()
		before := gh.JWKSFetches()
		forged := make([]string, 100)
		for i := range forged {
			forged[i] = gh.TokenWithUnpublishedKey(t, claims())
		}
		errs := make([]error, len(forged))
		var wg sync.WaitGroup
		for i, tok := range forged {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = second(v.Verify(ctx, tok, gh.URL, aud)) }()
		}
		wg.Wait()
		for i, err := range errs {
			if r := refusedBy(t, err, CheckSignature, forged[i]); r.Unavailable != unavailable {
				t.Errorf("refused %s, unavailable %v; want unavailable %v", r.Message, r.Unavailable, unavailable)
			}
		}
		return gh.JWKSFetches() - before
	}
	if n := flood(false); n != 1 {
		t.Errorf("100 forged tokens at once: %d key set requests, want 1", n)
	}
	if n := flood(false); n != 0 {
		t.Errorf("100 more within %s: %d key set requests, want none", KeysRefetchEvery, n)
	}
	advance(KeysRefetchEvery)
	if n := flood(false); n != 1 {
		t.Errorf("100 more once %s has passed: %d key set requests, want 1", KeysRefetchEvery, n)
	}
	// The issuer's key set failing: one request per period too, the tokens refused as unavailable
	// (with the error) in between.
	gh.Down(true)
	advance(KeysRefetchEvery)
	if n := flood(true); n != 1 {
		t.Errorf("100 forged tokens, the issuer down: %d key set requests, want 1", n)
	}
	if n := flood(true); n != 0 {
		t.Errorf("100 more within %s, the issuer down: %d key set requests, want none", KeysRefetchEvery, n)
	}
	gh.Down(false)
	advance(KeysRefetchEvery)
	if n := flood(false); n != 1 {
		t.Errorf("100 forged tokens, the issuer back: %d key set requests, want 1", n)
	}
	// A key published now: refused until the period has passed, then verified.
	gh.Rotate(t)
	fresh := gh.Token(t, claims())
	if r := refusedBy(t, second(v.Verify(ctx, fresh, gh.URL, aud)), CheckSignature, fresh); r.Unavailable || !strings.Contains(r.Message, "keys were fetched again less than 10s ago") {
		t.Errorf("a token of a key published within the period: %s", r.Error())
	}
	advance(KeysRefetchEvery)
	if _, err := v.Verify(ctx, fresh, gh.URL, aud); err != nil {
		t.Errorf("the new key once the period has passed: %v", err)
	}
	// The good tokens of the known key never wait for a fetch.
	before := gh.JWKSFetches()
	if _, err := v.Verify(ctx, gh.Token(t, claims()), gh.URL, aud); err != nil || gh.JWKSFetches() != before {
		t.Errorf("a token of a cached key: %v, %d key set requests", err, gh.JWKSFetches()-before)
	}
}
