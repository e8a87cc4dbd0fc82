// Package vsphere is the vmgroups controller's thin adapter over govmomi: one logged-in session that
// is kept, shared and logged in again when vCenter expires it, and the handful of operations the
// controller needs (folders, listing a folder's VMs in one call, clone, power, reconfigure, destroy,
// guestinfo, a cluster's anti-affinity rules, the VMs a guest address belongs to).
package vsphere

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"reflect"
	"strings"
	"sync"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/session"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// Credentials locate and open a vCenter session. They are never logged: String hides them.
type Credentials struct {
	Server   *url.URL // the SDK endpoint, without user information
	User     string
	Password string
	// Insecure skips verifying vCenter's certificate (self-signed certificates).
	Insecure bool
	// CAPEM, when set, are the PEM certificates vCenter's certificate is verified against instead
	// of the system's trust store (a self-signed or private CA, verified rather than skipped).
	CAPEM []byte
}

// String shows the server only.
func (c Credentials) String() string {
	if c.Server == nil {
		return "vCenter <no server>"
	}
	return "vCenter " + c.Server.Host
}

// GoString keeps %#v from printing the password.
func (c Credentials) GoString() string { return c.String() }

// Wrapper wraps the SOAP transport, e.g. to count calls in tests or metrics.
type Wrapper func(soap.RoundTripper) soap.RoundTripper

// Client is one logged-in vCenter session, safe for concurrent use.
type Client struct {
	vim    *vim25.Client
	soap   *soap.Client
	secret string // redacted from every error the client returns

	dcMu      sync.Mutex
	defaultDC string // the only datacenter, looked up once
}

// Login opens a session. wrap may be nil.
func Login(ctx context.Context, creds Credentials, wrap Wrapper) (*Client, error) {
	if creds.Server == nil {
		return nil, errors.New("no vCenter server")
	}
	u := *creds.Server
	u.User = nil // credentials go in the Login call only, never in URLs that errors might print
	sc := soap.NewClient(&u, creds.Insecure)
	if len(creds.CAPEM) > 0 && !creds.Insecure {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(creds.CAPEM) {
			return nil, errors.New("the vCenter CA bundle holds no PEM certificate")
		}
		sc.DefaultTransport().TLSClientConfig.RootCAs = pool
	}
	c := &Client{soap: sc, secret: creds.Password}
	// Built on the bare SOAP client, which sets its namespace and version.
	vim, err := vim25.NewClient(ctx, sc)
	if err != nil {
		sc.CloseIdleConnections()
		return nil, c.redact(err)
	}
	var wire soap.RoundTripper = metered{next: sc}
	if wrap != nil {
		wire = wrap(wire)
	}
	// Logins bypass the re-login layer so a refused login is never retried by it.
	direct := *vim
	direct.RoundTripper = wire
	login := func(ctx context.Context) error {
		return session.NewManager(&direct).Login(ctx, url.UserPassword(creds.User, creds.Password))
	}
	if err := login(ctx); err != nil {
		sc.CloseIdleConnections()
		return nil, c.redact(err)
	}
	vim.RoundTripper = &relogin{next: wire, login: login}
	c.vim = vim
	return c, nil
}

// Logout ends the session.
func (c *Client) Logout(ctx context.Context) error {
	defer c.soap.CloseIdleConnections()
	return c.redact(session.NewManager(c.vim).Logout(ctx))
}

// redact hides the password in err's message (a fault could echo a request). The original error
// stays reachable with errors.Unwrap and fault.Is.
func (c *Client) redact(err error) error {
	if err == nil || c.secret == "" || !strings.Contains(err.Error(), c.secret) {
		return err
	}
	return &redacted{err: err, msg: strings.ReplaceAll(err.Error(), c.secret, "<redacted>")}
}

type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// relogin logs in again when vCenter says the session is gone (expired, or ended by an
// administrator), then retries the call once. Concurrent callers share one new login.
type relogin struct {
	next  soap.RoundTripper
	login func(context.Context) error

	mu         sync.Mutex
	generation uint64
}

func (r *relogin) RoundTrip(ctx context.Context, req, res soap.HasFault) error {
	r.mu.Lock()
	gen := r.generation
	r.mu.Unlock()
	err := r.next.RoundTrip(ctx, req, res)
	expired := err != nil && fault.Is(err, &types.NotAuthenticated{}) || err == nil && unauthenticatedRetrieve(res)
	if !expired {
		return err
	}
	if lerr := r.renew(ctx, gen); lerr != nil {
		return errors.Join(err, lerr)
	}
	reset(res)
	return r.next.RoundTrip(ctx, req, res)
}

func (r *relogin) renew(ctx context.Context, seen uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.generation != seen {
		return nil // another caller logged in already
	}
	if err := r.login(ctx); err != nil {
		return err
	}
	r.generation++
	return nil
}

// unauthenticatedRetrieve reports a property collector answer without a session: vCenter does not
// fault RetrieveProperties then, it returns every property as missing with NotAuthenticated.
func unauthenticatedRetrieve(res soap.HasFault) bool {
	var objects []types.ObjectContent
	switch b := res.(type) {
	case *methods.RetrievePropertiesExBody:
		if b.Res != nil && b.Res.Returnval != nil {
			objects = b.Res.Returnval.Objects
		}
	case *methods.ContinueRetrievePropertiesExBody:
		if b.Res != nil {
			objects = b.Res.Returnval.Objects
		}
	case *methods.RetrievePropertiesBody:
		if b.Res != nil {
			objects = b.Res.Returnval
		}
	}
	for _, o := range objects {
		for _, m := range o.MissingSet {
			if _, ok := m.Fault.Fault.(*types.NotAuthenticated); ok {
				return true
			}
		}
	}
	return false
}

// reset zeroes a response body so it can be decoded into again.
func reset(res soap.HasFault) {
	v := reflect.ValueOf(res)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v.Elem().Set(reflect.Zero(v.Elem().Type()))
	}
}

// ErrNotFound is matched (errors.Is) by every NotFoundError.
var ErrNotFound = errors.New("not found")

// NotFoundError says which inventory item is missing: a user can act on it.
type NotFoundError struct {
	Kind string // "template", "datacenter", "folder", "resource pool", "datastore", "network"
	Name string
}

func (e *NotFoundError) Error() string { return e.Kind + " " + quote(e.Name) + " not found" }

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

func quote(s string) string {
	if s == "" {
		return "(default)"
	}
	return `"` + s + `"`
}

// InvalidError is a template or placement item that cannot be used as given: a name matching
// several items, no default among several, something other than a folder at a folder's path, a
// template without network adapter when a network is set. Like a NotFoundError, only a person can
// fix it, so it is not retried in a hurry.
type InvalidError struct {
	Kind    string // as NotFoundError's
	Name    string
	Problem string
}

func (e *InvalidError) Error() string { return e.Kind + " " + quote(e.Name) + ": " + e.Problem }

// IsTemplateNotFound reports whether err says the template is missing.
func IsTemplateNotFound(err error) bool {
	var nf *NotFoundError
	return errors.As(err, &nf) && nf.Kind == "template"
}

// IsGone reports whether err says the managed object no longer exists.
func IsGone(err error) bool { return fault.Is(err, &types.ManagedObjectNotFound{}) }

// IsLoginRefused reports whether vCenter refused the user name or password.
func IsLoginRefused(err error) bool { return fault.Is(err, &types.InvalidLogin{}) }

// IsUnreachable reports whether err is a network failure talking to vCenter.
func IsUnreachable(err error) bool {
	var ne net.Error
	var ue *url.Error
	return errors.As(err, &ne) || errors.As(err, &ue)
}
