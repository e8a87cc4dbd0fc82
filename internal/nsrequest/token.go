package nsrequest

import (
	"encoding/base64"
	"encoding/json"
	"hash/fnv"
	"strings"
	"time"
)

// refreshFraction is the share of a token's lifetime after which it is replaced; the jitter added
// to spread refreshes stays below 5% of the lifetime, so a token is always replaced before 80% of
// its lifetime has passed.
const (
	refreshFraction = 0.70
	maxJitter       = 0.05
)

// TokenState is what the credentials Secret records about the token it holds.
type TokenState struct {
	IssuedAt  time.Time
	ExpiresAt time.Time
}

// RefreshAt returns when a token should be replaced, with jitter in [0,1) spreading refreshes of
// tokens issued together.
func (s TokenState) RefreshAt(jitter float64) time.Time {
	life := s.ExpiresAt.Sub(s.IssuedAt)
	return s.IssuedAt.Add(time.Duration(float64(life) * (refreshFraction + maxJitter*jitter)))
}

// NeedsRefresh reports whether a token must be replaced now: it is due, or it was issued for a
// lifetime other than the one now asked for (a token-ttl change takes effect at once).
func (s TokenState) NeedsRefresh(now time.Time, wantTTL time.Duration, jitter float64) bool {
	if s.IssuedAt.IsZero() || s.ExpiresAt.IsZero() || !now.Before(s.RefreshAt(jitter)) {
		return true
	}
	// A request for a shorter lifetime than the token has takes effect at once. A longer one waits
	// for the next refresh: the API server may cap lifetimes (--service-account-max-token-expiration),
	// and re-issuing for it would loop.
	return s.ExpiresAt.Sub(s.IssuedAt) > wantTTL+time.Minute
}

// Jitter returns a stable number in [0,1) for a name, so that the refresh time of a request's token
// is the same in every reconcile and refreshes of tokens issued together are spread out.
func Jitter(name string) float64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return float64(h.Sum32()) / (1 << 32)
}

// TokenTimes reads the iat and exp claims of a ServiceAccount token (a JWT) without verifying it.
// Both come from the API server's clock, so the recorded lifetime is exact even when the
// operator's clock is off (which would otherwise make every token look longer-lived than asked for,
// and be replaced in a loop).
func TokenTimes(token string) (issued, expires time.Time, ok bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, time.Time{}, false
	}
	var claims struct {
		IssuedAt  int64 `json:"iat"`
		ExpiresAt int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.IssuedAt == 0 || claims.ExpiresAt <= claims.IssuedAt {
		return time.Time{}, time.Time{}, false
	}
	return time.Unix(claims.IssuedAt, 0), time.Unix(claims.ExpiresAt, 0), true
}
