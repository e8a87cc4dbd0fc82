package testenv

import (
	"net/http"
	"sync"

	"k8s.io/client-go/rest"
)

// RequestCounter counts the API requests made through a rest.Config, by HTTP method.
type RequestCounter struct {
	mu     sync.Mutex
	counts map[string]int
	log    []string
}

// Counting returns a copy of cfg whose requests are counted.
func Counting(cfg *rest.Config) (*rest.Config, *RequestCounter) {
	c := &RequestCounter{counts: map[string]int{}}
	out := rest.CopyConfig(cfg)
	out.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			c.mu.Lock()
			c.counts[req.Method]++
			c.log = append(c.log, req.Method+" "+req.URL.Path)
			c.mu.Unlock()
			return rt.RoundTrip(req)
		})
	})
	return out, c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Writes is the number of requests that are not reads (POST, PUT, PATCH, DELETE).
func (c *RequestCounter) Writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[http.MethodPost] + c.counts[http.MethodPut] + c.counts[http.MethodPatch] + c.counts[http.MethodDelete]
}

// Total is the number of requests of any kind.
func (c *RequestCounter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.counts {
		n += v
	}
	return n
}

// Log lists "METHOD path" of every request so far.
func (c *RequestCounter) Log() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.log...)
}

// Reset forgets the counts.
func (c *RequestCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts = map[string]int{}
	c.log = nil
}
