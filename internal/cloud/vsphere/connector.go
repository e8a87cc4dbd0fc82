package vsphere

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"
)

// loginTimeout bounds a login so an unreachable vCenter fails a reconcile instead of hanging it.
const loginTimeout = 30 * time.Second

// Connector keeps one session and hands it to every reconcile. It logs in on first use and again
// when the credentials change (a rotated Secret); the session itself logs in again when vCenter
// expires it.
type Connector struct {
	// Wrap wraps the SOAP transport of every session; optional.
	Wrap Wrapper

	mu     sync.Mutex
	key    [32]byte
	client *Client
}

// Get returns the session for creds, logging in when there is none for them yet.
func (c *Connector) Get(ctx context.Context, creds Credentials) (*Client, error) {
	key := fingerprint(creds)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil && c.key == key {
		return c.client, nil
	}
	if c.client != nil {
		c.logout()
	}
	lctx, cancel := context.WithTimeout(ctx, loginTimeout)
	defer cancel()
	client, err := Login(lctx, creds, c.Wrap)
	if err != nil {
		return nil, fmt.Errorf("logging in to %s: %w", creds, err)
	}
	c.client, c.key = client, key
	return client, nil
}

// Close logs out, e.g. when the manager stops.
func (c *Connector) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil {
		c.logout()
	}
}

func (c *Connector) logout() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.client.Logout(ctx) // best effort: vCenter expires the session anyway
	c.client = nil
}

func fingerprint(c Credentials) [32]byte {
	server := ""
	if c.Server != nil {
		server = c.Server.String()
	}
	return sha256.Sum256(fmt.Appendf(nil, "%q\x00%q\x00%q\x00%t\x00%q", server, c.User, c.Password, c.Insecure, c.CAPEM))
}
