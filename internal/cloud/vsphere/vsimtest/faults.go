package vsimtest

import (
	"context"
	"math/rand/v2"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// Faults makes calls to the simulator fail on purpose; use Wrap as (part of) the adapter's
// Wrapper. It works on the client's side of the wire rather than through the simulator's own
// fault injector (Service.AddFaultRule) for two reasons: that injector updates its rules' counters
// and random source under a read lock, which the race detector reports as soon as two calls run at
// once; and it can only refuse a call, while the case that could make an operator clone a VM twice
// or lose track of one is a call vCenter carried out whose answer never arrived.
type Faults struct {
	mu       sync.Mutex
	rule     *Rule
	rnd      *rand.Rand
	matched  int
	injected int
	next     int // round robin over rule.Kinds
}

// Kind is how an injected fault looks to the caller.
type Kind int

const (
	// SOAPFault refuses the call with a SystemError fault; vCenter does nothing.
	SOAPFault Kind = iota
	// Reset carries the call out, then reports a connection reset: the answer is lost.
	Reset
	// Ignore answers as if the call was carried out, and does nothing: a guest that ignores a
	// request to shut down, say.
	Ignore
	// Hold carries the call out, then keeps the answer until the caller gives up (its context
	// ends): the caller dies not knowing what it did, as a manager stopped mid-call.
	Hold
)

// Rule says which calls fail and how.
type Rule struct {
	// Kinds of the faults injected, in turn; default SOAPFault.
	Kinds []Kind
	// Methods limits the rule to these SOAP methods (e.g. "CloneVM_Task"); empty: every method.
	Methods []string
	// Match limits the rule further; nil matches every call.
	Match func(method string, req soap.HasFault) bool
	// After lets this many matching calls through before faults start.
	After int
	// Fraction of the matching calls (after After) that fail, 0 < Fraction ≤ 1.
	Fraction float64
}

// InjectedMessage is the text of injected SOAP faults.
const InjectedMessage = "fault injected by vsimtest"

// Set replaces the rule; nil lets every call through. Counts restart.
func (f *Faults) Set(r *Rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rule, f.matched, f.injected, f.next = r, 0, 0, 0
	if f.rnd == nil {
		f.rnd = rand.New(rand.NewPCG(1, 2)) // a fixed seed: the same fraction on every run
	}
}

// Injected is the number of faults injected since the rule was set; a lost or held answer counts
// once the call was carried out.
func (f *Faults) Injected() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.injected
}

// Wrap injects the faults into calls through rt.
func (f *Faults) Wrap(rt soap.RoundTripper) soap.RoundTripper { return faultRT{f: f, next: rt} }

type faultRT struct {
	f    *Faults
	next soap.RoundTripper
}

func (r faultRT) RoundTrip(ctx context.Context, req, res soap.HasFault) error {
	kind, ok := r.f.pick(req)
	if !ok {
		return r.next.RoundTrip(ctx, req, res)
	}
	switch kind {
	case Reset:
		_ = r.next.RoundTrip(ctx, req, res)
		r.f.count()
		return &url.Error{Op: "Post", URL: "https://vcsim/sdk", Err: syscall.ECONNRESET}
	case Ignore:
		r.f.count()
		return nil
	case Hold:
		_ = r.next.RoundTrip(ctx, req, res)
		r.f.count() // counted once carried out, so a test may stop the caller then
		<-ctx.Done()
		return ctx.Err()
	default:
		r.f.count()
		fault := &soap.Fault{Code: "ServerFaultCode", String: InjectedMessage}
		fault.Detail.Fault = &types.SystemError{Reason: InjectedMessage}
		return soap.WrapSoapFault(fault)
	}
}

func (f *Faults) count() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.injected++
}

// pick decides whether the call fails, and how.
func (f *Faults) pick(req soap.HasFault) (Kind, bool) {
	method := strings.TrimSuffix(reflect.TypeOf(req).Elem().Name(), "Body")
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.rule
	if r == nil || len(r.Methods) > 0 && !slices.Contains(r.Methods, method) || r.Match != nil && !r.Match(method, req) {
		return 0, false
	}
	f.matched++
	if f.matched <= r.After || f.rnd.Float64() >= r.Fraction {
		return 0, false
	}
	if len(r.Kinds) == 0 {
		return SOAPFault, true
	}
	k := r.Kinds[f.next%len(r.Kinds)]
	f.next++
	return k, true
}
