package nsrequest

import (
	"hash/fnv"
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
