package mirrors

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// upstreamChecker asks an upstream registry whether a mirror's credentials are accepted, the way
// a registry client starts: GET /v2/, then the token service its challenge names. An answer is
// remembered for a resync period per upstream and credentials, so reconciles cost no request.
// An upstream that cannot be reached is no one's mistake (the cache serves what it has): only a
// refusal is reported.
type upstreamChecker struct {
	http  *http.Client
	every time.Duration

	mu   sync.Mutex
	last map[string]upstreamAnswer
}

type upstreamAnswer struct {
	at      time.Time
	problem string
}

func newUpstreamChecker(every time.Duration) *upstreamChecker {
	return &upstreamChecker{
		http:  &http.Client{Timeout: 10 * time.Second},
		every: every,
		last:  map[string]upstreamAnswer{},
	}
}

// check returns why the upstream refuses the credentials (or anonymous pulls), or "".
func (u *upstreamChecker) check(ctx context.Context, upstream string, creds *mirror.Credentials) string {
	key := upstream + "\x00" + credentialsID(creds)
	u.mu.Lock()
	a, ok := u.last[key]
	u.mu.Unlock()
	if ok && time.Since(a.at) < u.every {
		return a.problem
	}
	problem := u.ask(ctx, upstream, creds)
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	// Answers past their period go: rotated credentials would otherwise pile up.
	maps.DeleteFunc(u.last, func(_ string, a upstreamAnswer) bool { return now.Sub(a.at) >= u.every })
	u.last[key] = upstreamAnswer{at: now, problem: problem}
	return problem
}

// credentialsID tells credentials apart without keeping them.
func credentialsID(c *mirror.Credentials) string {
	if c == nil {
		return ""
	}
	h := sha256.Sum256([]byte(c.Username + "\x00" + c.Password))
	return hex.EncodeToString(h[:8])
}

func (u *upstreamChecker) ask(ctx context.Context, upstream string, creds *mirror.Credentials) string {
	code, header, err := u.get(ctx, upstream+"/v2/", nil)
	if err != nil || code != http.StatusUnauthorized {
		return ""
	}
	scheme, params := parseChallenge(header.Get("WWW-Authenticate"))
	who := "anonymous pulls"
	if creds != nil {
		who = "the mirror's credentials"
	}
	switch scheme {
	case "basic":
		if creds == nil {
			return fmt.Sprintf("upstream %s requires credentials (HTTP 401): set credentialsSecret", upstream)
		}
		code, _, err := u.get(ctx, upstream+"/v2/", creds)
		if err == nil && code == http.StatusUnauthorized {
			return fmt.Sprintf("upstream %s refused %s (HTTP 401)", upstream, who)
		}
	case "bearer":
		realm, err := url.Parse(params["realm"])
		if err != nil || !mirror.CredentialsAllowed(upstream, realm) {
			return "" // the cache does not send credentials there either
		}
		q := realm.Query()
		if params["service"] != "" {
			q.Set("service", params["service"])
		}
		realm.RawQuery = q.Encode()
		code, _, err := u.get(ctx, realm.String(), creds)
		if err == nil && (code == http.StatusUnauthorized || code == http.StatusForbidden) {
			return fmt.Sprintf("upstream %s refused %s (HTTP %d from its token service %s)", upstream, who, code, realm.Host)
		}
	}
	return ""
}

// get returns the status code and headers of a GET of target, the body read and closed.
func (u *upstreamChecker) get(ctx context.Context, target string, creds *mirror.Credentials) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return 0, nil, err
	}
	if creds != nil {
		req.SetBasicAuth(creds.Username, creds.Password)
	}
	resp, err := u.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, resp.Header, nil
}

// parseChallenge reads a WWW-Authenticate header's scheme (lower case) and parameters.
func parseChallenge(h string) (string, map[string]string) {
	scheme, rest, _ := strings.Cut(strings.TrimSpace(h), " ")
	params := map[string]string{}
	for rest != "" {
		var kv string
		rest = strings.TrimLeft(rest, " ,")
		key, after, ok := strings.Cut(rest, "=")
		if !ok {
			break
		}
		if strings.HasPrefix(after, `"`) {
			end := strings.Index(after[1:], `"`)
			if end < 0 {
				break
			}
			kv, rest = after[1:1+end], after[2+end:]
		} else {
			kv, rest, _ = strings.Cut(after, ",")
		}
		params[strings.ToLower(strings.TrimSpace(key))] = kv
	}
	return strings.ToLower(scheme), params
}
