package mirrorcache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// remote is the cache's client of the upstream registry: the data path's fills and checks go
// through it, not through distribution's proxy (whose auth client is internal to its module). It
// answers the upstream's challenge itself: Basic with the credentials, or a Bearer token from the
// realm the challenge names, the credentials given only to a realm mirror.CredentialsAllowed trusts.
type remote struct {
	base     *url.URL
	credsDir string
	client   *http.Client

	mu     sync.Mutex
	scheme string            // "", "basic" or "bearer": learned from the first 401
	params map[string]string // the bearer challenge's realm and service
	tokens map[string]token  // by scope
}

type token struct {
	value   string
	expires time.Time
}

func newRemote(upstream, credsDir string) (*remote, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	// http.DefaultTransport is the counting observer (metrics.go); redirects to blob storage
	// are followed, and Go drops the Authorization header when one leaves the host.
	return &remote{base: u, credsDir: credsDir, client: &http.Client{}, tokens: map[string]token{}}, nil
}

// manifestAccept is every manifest type the cache stores: it asks for all of them, as
// distribution's proxy does, so one stored answer serves every client.
var manifestAccept = strings.Join([]string{
	"application/vnd.oci.image.index.v1+json",
	"application/vnd.oci.image.manifest.v1+json",
	"application/vnd.docker.distribution.manifest.list.v2+json",
	"application/vnd.docker.distribution.manifest.v2+json",
}, ", ")

// do sends method to /v2/<repo>/<kind>/<ref>, authenticating for pulls of repo. The caller
// closes the body.
func (r *remote) do(ctx context.Context, method, repo, kind, ref string) (*http.Response, error) {
	return r.send(ctx, method, repo, kind, ref, 0)
}

// send is do asking for the content from byte from on (a Range request when from > 0).
func (r *remote) send(ctx context.Context, method, repo, kind, ref string, from int64) (*http.Response, error) {
	target := r.base.JoinPath("/v2/", repo, kind, ref).String()
	scope := "repository:" + repo + ":pull"
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, method, target, nil)
		if err != nil {
			return nil, err
		}
		if kind == "manifests" {
			req.Header.Set("Accept", manifestAccept)
		}
		if from > 0 {
			req.Header.Set("Range", "bytes="+strconv.FormatInt(from, 10)+"-")
		}
		if err := r.authorize(ctx, req, scope); err != nil {
			return nil, err
		}
		resp, err := r.client.Do(req)
		if err != nil {
			return nil, err
		}
		// A first 401 teaches the scheme (or says the token expired): learn, then try once more.
		if resp.StatusCode != http.StatusUnauthorized || attempt > 0 || !r.learn(resp.Header.Values("WWW-Authenticate"), scope) {
			return resp, nil
		}
		drain(resp)
	}
}

// learn records the upstream's challenge and forgets the scope's token; it reports whether a
// retry may now succeed.
func (r *remote) learn(challenges []string, scope string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range challenges {
		scheme, params := parseChallenge(c)
		switch scheme {
		case "bearer", "basic":
			r.scheme, r.params = scheme, params
			delete(r.tokens, scope)
			return true
		}
	}
	return false
}

func (r *remote) authorize(ctx context.Context, req *http.Request, scope string) error {
	r.mu.Lock()
	scheme, params, tok := r.scheme, r.params, r.tokens[scope]
	r.mu.Unlock()
	switch scheme {
	case "basic":
		user, pass, err := readCredentials(r.credsDir)
		if err != nil {
			return err
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
	case "bearer":
		if tok.value == "" || time.Now().After(tok.expires) {
			t, err := r.fetchToken(ctx, params, scope)
			if err != nil {
				return err
			}
			r.mu.Lock()
			r.tokens[scope] = t
			r.mu.Unlock()
			tok = t
		}
		if tok.value != "" {
			req.Header.Set("Authorization", "Bearer "+tok.value)
		}
	}
	return nil
}

// fetchToken asks the challenge's realm for a pull token, with the credentials when the realm
// may have them.
func (r *remote) fetchToken(ctx context.Context, params map[string]string, scope string) (token, error) {
	realm, err := url.Parse(params["realm"])
	if err != nil || realm.Host == "" || (realm.Scheme != "https" && realm.Scheme != "http") {
		return token{}, fmt.Errorf("the upstream's token realm %q is not a URL", params["realm"])
	}
	q := realm.Query()
	if s := params["service"]; s != "" {
		q.Set("service", s)
	}
	q.Set("scope", scope)
	realm.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, realm.String(), nil)
	if err != nil {
		return token{}, err
	}
	// The one rule for where the upstream's credentials may go, on the realm's whole URL (scheme
	// included: distribution's helper sees only a host).
	if mirror.CredentialsAllowed(r.base.String(), realm) {
		user, pass, err := readCredentials(r.credsDir)
		if err != nil {
			return token{}, err
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return token{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return token{}, fmt.Errorf("the upstream's token service %s answered %s", realm.Host, resp.Status)
	}
	var body struct {
		Token       string `json:"token"`
		AccessToken string `json:"access_token"`
		ExpiresIn   int    `json:"expires_in"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return token{}, fmt.Errorf("the upstream's token service %s: %w", realm.Host, err)
	}
	t := token{value: body.Token, expires: time.Now().Add(time.Minute)}
	if t.value == "" {
		t.value = body.AccessToken
	}
	if t.value == "" {
		return token{}, errors.New("the upstream's token service returned no token")
	}
	if body.ExpiresIn > 30 {
		// Renewed a little early: a token must not expire between two requests of one fill.
		t.expires = time.Now().Add(time.Duration(body.ExpiresIn-20) * time.Second)
	}
	return t, nil
}

// parseChallenge reads `Bearer realm="…",service="…"` (RFC 7235 auth-param lists).
func parseChallenge(h string) (scheme string, params map[string]string) {
	scheme, rest, _ := strings.Cut(strings.TrimSpace(h), " ")
	params = map[string]string{}
	for rest = strings.TrimSpace(rest); rest != ""; rest = strings.TrimLeft(strings.TrimSpace(rest), ",") {
		key, after, ok := strings.Cut(rest, "=")
		if !ok {
			break
		}
		key = strings.ToLower(strings.TrimSpace(key))
		after = strings.TrimSpace(after)
		var val string
		if strings.HasPrefix(after, `"`) {
			var b strings.Builder
			i := 1
			for ; i < len(after) && after[i] != '"'; i++ {
				if after[i] == '\\' && i+1 < len(after) {
					i++
				}
				b.WriteByte(after[i])
			}
			val, rest = b.String(), after[min(i+1, len(after)):]
		} else {
			val, rest, _ = strings.Cut(after, ",")
			val = strings.TrimSpace(val)
		}
		params[key] = val
	}
	return strings.ToLower(scheme), params
}

// drain reads a little of a body that is not used, so the connection can be reused.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
