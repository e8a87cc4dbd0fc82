package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
)

// DefaultKindPollInterval is how often discovery is asked whether the kinds still awaited are served.
const DefaultKindPollInterval = 10 * time.Second

// Need is something a controller, or one watch of it, waits for: kinds served by the API server (a
// CRD installed after the manager started), and what a probe finds where kinds say nothing (a
// namespace and a ServiceAccount of an engine whose kinds are built in). Once met it stays met.
type Need struct {
	// Name says what is awaited, in logs ("Kyverno", "the intents controller's kinds"). It is the
	// need's identity: one Name, one need.
	Name string
	// Kinds must all be served.
	Kinds []schema.GroupVersionKind
	// Probe, when set, must pass too. It is asked at each look until the need is met.
	Probe func(ctx context.Context) (bool, error)
	// Announce, when set, is logged once when the need is met ("policy engine installed").
	Announce string
}

// Kinds follows what appears later: the manager's one discovery poller. A controller whose kinds
// may be missing waits on it (Starter), and a controller that watches a kind served only later
// builds that watch from its start as a source of Kinds (Watch, WhenMet): it starts when the kind
// is served. No watch is added to a running controller, and no controller polls discovery itself.
//
// Only needs not met yet cost anything: each look asks discovery once per group version they
// name, and runs their probes.
type Kinds struct {
	discovery discovery.DiscoveryInterface
	interval  time.Duration
	log       logr.Logger

	mu    sync.Mutex
	needs map[string]*need
	order []string // names, in registration order (the log reads in the order they were asked)
}

// need is the state of one Need.
type need struct {
	Need
	met     chan struct{} // closed once met
	done    bool
	missing string // what the last look found missing, for the log (once per change)
	failed  bool   // the last look could not tell (discovery or the probe failed)
}

// NewKinds makes the manager's Kinds, polling every interval (DefaultKindPollInterval when zero),
// and adds it to mgr. Make one per manager.
func NewKinds(mgr ctrl.Manager, interval time.Duration) (*Kinds, error) {
	d, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
	if err != nil {
		return nil, err
	}
	k := NewKindsWith(d, interval, mgr.GetLogger().WithName("kinds"))
	return k, mgr.Add(k)
}

// NewKindsWith is a Kinds asking d, not yet started (tests give it a discovery of their own).
func NewKindsWith(d discovery.DiscoveryInterface, interval time.Duration, log logr.Logger) *Kinds {
	if interval <= 0 {
		interval = DefaultKindPollInterval
	}
	return &Kinds{discovery: d, interval: interval, log: log, needs: map[string]*need{}}
}

// NeedLeaderElection is false: a standby's controllers wait for their kinds too (they warm up).
func (k *Kinds) NeedLeaderElection() bool { return false }

// Start looks for what is awaited every interval until ctx ends.
func (k *Kinds) Start(ctx context.Context) error {
	t := time.NewTicker(k.interval)
	defer t.Stop()
	for {
		k.look(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// register returns n's state, made when first asked for.
func (k *Kinds) register(n Need) *need {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := k.needs[n.Name]
	if s == nil {
		s = &need{Need: n, met: make(chan struct{})}
		k.needs[n.Name] = s
		k.order = append(k.order, n.Name)
	}
	return s
}

// Has reports whether n was met at the last look (no request: cheap enough for every reconcile).
// A need asked for the first time is looked at from the next look on.
func (k *Kinds) Has(n Need) bool {
	s := k.register(n)
	k.mu.Lock()
	defer k.mu.Unlock()
	return s.done
}

// Check looks at n now, if it is not met yet, and reports whether it is met. A controller asks at
// its setup, so that what is there at the start is known before its first reconcile.
func (k *Kinds) Check(ctx context.Context, n Need) bool {
	if k.Has(n) {
		return true
	}
	k.lookAt(ctx, []*need{k.register(n)})
	return k.Has(n)
}

// Met is closed once n is met.
func (k *Kinds) Met(n Need) <-chan struct{} { return k.register(n).met }

// Wait blocks until n is met (looking at once) or ctx ends (ctx's error).
func (k *Kinds) Wait(ctx context.Context, n Need) error {
	if k.Check(ctx, n) {
		return nil
	}
	select {
	case <-k.Met(n):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// look looks at every need not met yet.
func (k *Kinds) look(ctx context.Context) {
	k.mu.Lock()
	var open []*need
	for _, name := range k.order {
		if s := k.needs[name]; !s.done {
			open = append(open, s)
		}
	}
	k.mu.Unlock()
	if len(open) > 0 {
		k.lookAt(ctx, open)
	}
}

// lookAt asks discovery once per group version the needs name, then their probes, and marks met
// those whose kinds are all served and whose probe passes.
func (k *Kinds) lookAt(ctx context.Context, needs []*need) {
	served := map[schema.GroupVersion][]string{} // kinds served per group version looked up
	failed := map[schema.GroupVersion]error{}
	for _, s := range needs {
		for _, gvk := range s.Kinds {
			gv := gvk.GroupVersion()
			if _, ok := served[gv]; ok || failed[gv] != nil {
				continue
			}
			kinds, err := servedKinds(k.discovery, gv)
			if err != nil {
				failed[gv] = err
				continue
			}
			served[gv] = kinds
		}
	}
	for _, s := range needs {
		missing, lookFailed := k.missing(ctx, s, served, failed)
		k.mu.Lock()
		if s.done {
			k.mu.Unlock()
			continue
		}
		changed := missing != s.missing
		s.missing, s.failed = missing, lookFailed
		if missing == "" {
			s.done = true
			close(s.met)
		}
		k.mu.Unlock()
		switch {
		case missing == "" && s.Announce != "":
			k.log.Info(s.Announce, "need", s.Name)
		case missing == "":
			k.log.V(1).Info("met", "need", s.Name)
		case changed && lookFailed:
			k.log.Info("looking for what is awaited failed; looked for again every "+k.interval.String(), "need", s.Name, "missing", missing)
		case changed:
			k.log.V(1).Info("waiting", "need", s.Name, "missing", missing, "interval", k.interval.String())
		}
	}
}

// Missing says what of n the last look found missing ("" when met or not looked at yet), and
// whether that look failed (discovery or the probe answered an error) rather than found it absent.
func (k *Kinds) Missing(n Need) (what string, failed bool) {
	s := k.register(n)
	k.mu.Lock()
	defer k.mu.Unlock()
	return s.missing, s.failed
}

// missing says what of s is not there yet ("" when s is met), and whether a question failed.
func (k *Kinds) missing(ctx context.Context, s *need, served map[schema.GroupVersion][]string, failed map[schema.GroupVersion]error) (string, bool) {
	var out []string
	lookFailed := false
	for _, gvk := range s.Kinds {
		gv := gvk.GroupVersion()
		switch {
		case failed[gv] != nil:
			lookFailed = true
			out = append(out, fmt.Sprintf("%s (discovery failed: %v)", gvk.Kind, failed[gv]))
		case !slices.Contains(served[gv], gvk.Kind):
			out = append(out, gvk.Kind+"."+gvk.GroupVersion().String())
		}
	}
	if len(out) == 0 && s.Probe != nil {
		ok, err := s.Probe(ctx)
		switch {
		case err != nil:
			lookFailed = true
			out = append(out, "probe failed: "+err.Error())
		case !ok:
			out = append(out, "not installed")
		}
	}
	return strings.Join(out, ", "), lookFailed
}

// servedKinds are the kinds the API server serves in gv (none when it serves no such group version).
func servedKinds(d discovery.DiscoveryInterface, gv schema.GroupVersion) ([]string, error) {
	list, err := d.ServerResourcesForGroupVersion(gv.String())
	if apierrors.IsNotFound(err) {
		return []string{}, nil
	}
	if err != nil {
		return nil, err
	}
	kinds := make([]string, 0, len(list.APIResources))
	for _, r := range list.APIResources {
		kinds = append(kinds, r.Kind)
	}
	return kinds, nil
}
