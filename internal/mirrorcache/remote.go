package mirrorcache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// remote is the cache's one client of the upstream registry: fills, checks, tag lookups and tag
// lists all go through it. It answers the upstream's challenge itself, learned from the first 401
// (the cache never pings the upstream, so it starts while the upstream is down): Basic with the
// credentials, or a Bearer token from the realm the challenge names, the credentials read fresh
// from their files (a rotated Secret is used at once) and given only to a realm
// mirror.CredentialsAllowed trusts, judged on its whole URL.
type remote struct {
	base     *url.URL
	credsDir string
	client   *http.Client
	health   *upstreamHealth // what the upstream did last

	mu     sync.Mutex
	scheme string            // "", "basic" or "bearer": learned from the first 401
	params map[string]string // the bearer challenge's realm and service
	tokens map[string]token  // by scope
}

type token struct {
	value   string
	expires time.Time
}

func newRemote(upstream, credsDir string, log logr.Logger) (*remote, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	// Counted and logged (metrics.go). Redirects (to blob storage) are followed, with the
	// credentials or token only where the one rule allows: Go's own policy would send them to any
	// port of the same host name and to any subdomain, whatever the scheme.
	health := &upstreamHealth{log: log}
	client := &http.Client{Transport: upstreamTransport(health), CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		if !mirror.CredentialsAllowed(upstream, req.URL) {
			req.Header.Del("Authorization")
		}
		return nil
	}}
	return &remote{base: u, credsDir: credsDir, client: client, health: health, tokens: map[string]token{}}, nil
}

// maxRedirects is how many redirects one upstream request follows (Go's default).
const maxRedirects = 10

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
	return r.roundTrip(ctx, method, r.base.JoinPath("/v2/", repo, kind, ref), repo, func(req *http.Request) {
		if kind == "manifests" {
			req.Header.Set("Accept", manifestAccept)
		}
		if from > 0 {
			req.Header.Set("Range", "bytes="+strconv.FormatInt(from, 10)+"-")
		}
	})
}

// roundTrip sends method to target, a URL of the upstream, authenticated for pulls of repo;
// prepare sets the request's own headers.
func (r *remote) roundTrip(ctx context.Context, method string, target *url.URL, repo string, prepare func(*http.Request)) (*http.Response, error) {
	scope := "repository:" + repo + ":pull"
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, method, target.String(), nil)
		if err != nil {
			return nil, err
		}
		prepare(req)
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
	// included).
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

// readCredentials reads the username and password files; neither present means anonymous.
func readCredentials(dir string) (username, password string, err error) {
	u, uerr := os.ReadFile(filepath.Join(dir, mirror.UsernameKey))
	p, perr := os.ReadFile(filepath.Join(dir, mirror.PasswordKey))
	switch {
	case errors.Is(uerr, fs.ErrNotExist) && errors.Is(perr, fs.ErrNotExist):
		return "", "", nil
	case uerr != nil:
		return "", "", fmt.Errorf("upstream credentials: %w", uerr)
	case perr != nil:
		return "", "", fmt.Errorf("upstream credentials: %w", perr)
	}
	// A file made with kubectl create secret --from-file often ends with a line break.
	return strings.TrimRight(string(u), "\r\n"), strings.TrimRight(string(p), "\r\n"), nil
}

// maxTagPages bounds the pages of one upstream tag list the cache follows, and maxTagPageBytes
// the size of one page. A client asking for more than maxTagsAsked tags at once gets the whole list
// paged by the cache.
const (
	maxTagPages     = 100
	maxTagPageBytes = 8 << 20
	maxTagsAsked    = 10000
)

// tags lists repo's tags at the upstream, after last when it is set: every one (n < 0: the
// upstream's pages followed, on its own host only), or one page of at most n+1 (n >= 0: one more
// than the client asked for says whether more follow without a request that finds nothing), and
// more when the upstream's Link says others follow. status is the upstream's answer when it was
// not a list (404 …), 0 when it gave none.
func (r *remote) tags(ctx context.Context, repo string, n int, last string) (tags []string, more bool, status int, err error) {
	page := r.base.JoinPath("/v2/", repo, "tags", "list")
	q := url.Values{}
	if n >= 0 {
		q.Set("n", strconv.Itoa(n+1))
	}
	if last != "" {
		q.Set("last", last)
	}
	page.RawQuery = q.Encode()
	for range maxTagPages {
		resp, err := r.roundTrip(ctx, http.MethodGet, page, repo, func(req *http.Request) {
			req.Header.Set("Accept", "application/json")
		})
		if err != nil {
			return nil, false, 0, err
		}
		if resp.StatusCode != http.StatusOK {
			drain(resp)
			return nil, false, resp.StatusCode, fmt.Errorf("the upstream answered %s", resp.Status)
		}
		var body struct {
			Tags []string `json:"tags"`
		}
		err = json.NewDecoder(io.LimitReader(resp.Body, maxTagPageBytes)).Decode(&body)
		link := resp.Header.Get("Link")
		drain(resp)
		if err != nil {
			return nil, false, resp.StatusCode, fmt.Errorf("the upstream's tag list: %w", err)
		}
		tags = append(tags, body.Tags...)
		next := nextLink(link)
		switch {
		case next == "":
			return tags, false, http.StatusOK, nil
		case n >= 0:
			return tags, true, http.StatusOK, nil
		}
		u, err := page.Parse(next)
		if err != nil || u.Scheme != r.base.Scheme || u.Host != r.base.Host {
			return nil, false, resp.StatusCode, fmt.Errorf("the upstream's tag list goes on at %q, not on the upstream", next)
		}
		page = u
	}
	return nil, false, http.StatusOK, fmt.Errorf("the upstream's tag list of %s has more than %d pages", repo, maxTagPages)
}

// nextLink is the target of an RFC 8288 Link header's rel="next" link, "" when it has none.
func nextLink(h string) string {
	for h != "" {
		open := strings.IndexByte(h, '<')
		end := strings.IndexByte(h, '>')
		if open < 0 || end < open {
			return ""
		}
		target := h[open+1 : end]
		params := h[end+1:]
		// The link's parameters run to the next link (a comma outside quotes).
		stop, quoted := len(params), false
		for i := 0; i < len(params); i++ {
			switch {
			case params[i] == '"':
				quoted = !quoted
			case params[i] == ',' && !quoted:
				stop = i
			}
			if stop != len(params) {
				break
			}
		}
		for _, p := range strings.Split(params[:stop], ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if ok && strings.EqualFold(strings.TrimSpace(k), "rel") {
				for _, rel := range strings.Fields(strings.Trim(strings.TrimSpace(v), `"`)) {
					if strings.EqualFold(rel, "next") {
						return target
					}
				}
			}
		}
		h = params[stop:]
		if h != "" {
			h = h[1:]
		}
	}
	return ""
}
