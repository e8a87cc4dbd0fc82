package vmgroups

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// opKind is what runs on a VM in the background.
type opKind string

const (
	opClone       opKind = "clone"
	opDelete      opKind = "delete"
	opPowerOn     opKind = "power-on"
	opReplace     opKind = "replace"
	opReconfigure opKind = "reconfigure"
)

// ended is an operation that finished since the group's last reconcile.
type ended struct {
	kind    opKind
	vm      string
	done    string // what it did, for the operations announced one by one (replace, reconfigure)
	warning string // what went other than planned (a guest that had to be powered off hard)
	err     error
}

// background runs the vCenter work that takes long (clones, guest shutdowns) outside the reconciles. A reconcile only starts operations and never waits for one;
// each operation's end wakes its group's reconcile through wake, so the next clone starts as soon
// as one ends and a newer spec is read at every step.
type background struct {
	wake chan event.TypedGenericEvent[*computev1alpha1.VmGroup]

	ctx    context.Context // ends when the manager stops
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	groups  map[types.NamespacedName]*groupWork
}

// groupWork is one group's background state.
type groupWork struct {
	running map[string]opKind // VM name → what runs on it
	ended   []ended           // since the group's last reconcile
	// source is the template and placement resolved for the clones in flight, reused until the
	// group settles or a clone fails, so a step does not resolve it again.
	source    *vcenter.Source
	sourceFor string
	// aff keeps the group's anti-affinity rule for the placement and strictness affFor names; kept
	// for the group's life (its cluster does not move).
	aff    *affinity
	affFor string
	// After a failed operation no new one starts before retryAt; failures counts them since the
	// last success (the backoff grows with it), lastFailure is reported meanwhile.
	failures    int
	retryAt     time.Time
	lastFailure *failure
}

func newBackground() *background {
	ctx, cancel := context.WithCancel(context.Background())
	return &background{
		wake:   make(chan event.TypedGenericEvent[*computev1alpha1.VmGroup], 1024),
		ctx:    ctx,
		cancel: cancel,
		groups: map[types.NamespacedName]*groupWork{},
	}
}

// stop cancels every operation (their vCenter tasks go on; the next manager finds what they did)
// and waits for them to return.
func (b *background) stop() {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}

// group returns the group's state, made on first use. Callers hold mu.
func (b *background) group(key types.NamespacedName) *groupWork {
	g := b.groups[key]
	if g == nil {
		g = &groupWork{running: map[string]opKind{}}
		b.groups[key] = g
	}
	return g
}

// take returns what ended since the last call, and what runs now.
func (b *background) take(key types.NamespacedName) ([]ended, vsphere.InFlight) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.group(key)
	out := g.ended
	g.ended = nil
	return out, g.inFlight()
}

func (g *groupWork) inFlight() vsphere.InFlight {
	f := vsphere.InFlight{Cloning: map[string]bool{}, Busy: map[string]bool{}}
	for name, kind := range g.running {
		if kind == opClone {
			f.Cloning[name] = true
		} else {
			f.Busy[name] = true
		}
	}
	return f
}

// inFlight is what runs for the group now; unlike take, it leaves what ended for the next reconcile.
func (b *background) inFlight(key types.NamespacedName) vsphere.InFlight {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.group(key).inFlight()
}

// running counts the operations running for the group.
func (b *background) running(key types.NamespacedName) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.groups[key]; g != nil {
		return len(g.running)
	}
	return 0
}

// active reports whether anything runs for the group that will wake it.
func (b *background) active(key types.NamespacedName) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.groups[key]
	return g != nil && len(g.running) > 0
}

// forget drops a group's state once it is gone.
func (b *background) forget(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.groups[key]; g != nil && len(g.running) == 0 {
		delete(b.groups, key)
	}
}

// start runs op on the VM in the background; its end is recorded (with done, what it did, when it
// succeeds) and wakes the group. op returns a warning to announce, if any. Nothing starts once the
// manager is stopping.
func (b *background) start(vg *computev1alpha1.VmGroup, vm string, kind opKind, done string, op func(context.Context) (string, error)) {
	key := types.NamespacedName{Namespace: vg.Namespace, Name: vg.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return
	}
	b.group(key).running[vm] = kind
	b.wg.Go(func() {
		warning, err := op(b.ctx)
		if err != nil {
			done = ""
		}
		b.mu.Lock()
		g := b.group(key)
		delete(g.running, vm)
		g.ended = append(g.ended, ended{kind: kind, vm: vm, done: done, warning: warning, err: err})
		b.mu.Unlock()
		b.wakeUp(key)
	})
}

// wakeUp enqueues the group's reconcile.
func (b *background) wakeUp(key types.NamespacedName) {
	vg := &computev1alpha1.VmGroup{}
	vg.Namespace, vg.Name = key.Namespace, key.Name
	select {
	case b.wake <- event.TypedGenericEvent[*computev1alpha1.VmGroup]{Object: vg}:
	case <-b.ctx.Done():
	}
}

// cachedSource returns the source resolved for the group's clones under this template and
// placement, or nil.
func (b *background) cachedSource(key types.NamespacedName, id string) *vcenter.Source {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.group(key)
	if g.sourceFor != id {
		return nil
	}
	return g.source
}

func (b *background) keepSource(key types.NamespacedName, id string, src *vcenter.Source) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.group(key)
	g.source, g.sourceFor = src, id
}

// affinity returns the group's rule keeper for this placement and strictness, or nil.
func (b *background) affinity(key types.NamespacedName, id string) *affinity {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.group(key); g.affFor == id {
		return g.aff
	}
	return nil
}

// currentAffinity is the group's rule keeper, if any.
func (b *background) currentAffinity(key types.NamespacedName) *affinity {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.group(key).aff
}

// dropAffinity retires the group's rule keeper, if any, and reports whether there was one.
func (b *background) dropAffinity(key types.NamespacedName) bool {
	b.mu.Lock()
	g := b.group(key)
	a := g.aff
	g.aff, g.affFor = nil, ""
	b.mu.Unlock()
	if a != nil {
		a.drop()
	}
	return a != nil
}

func (b *background) keepAffinity(key types.NamespacedName, id string, a *affinity) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.group(key)
	if g.aff != nil && g.aff != a {
		g.aff.drop() // a keeper of another placement: its operations stop writing
	}
	g.aff, g.affFor = a, id
}

// settle clears what a group needs only while it changes: its resolved source, its failures.
func (b *background) settle(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.groups[key]; g != nil {
		g.source, g.sourceFor = nil, ""
		g.failures, g.retryAt, g.lastFailure = 0, time.Time{}, nil
	}
}

// failed records a failed step; it returns how long to wait before the next and the failure to
// report meanwhile. Failures only a person can fix wait slowRetry; others back off from 1 s to 5 min.
func (b *background) failed(key types.NamespacedName, f *failure, slowRetry time.Duration) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.group(key)
	g.failures++
	g.source, g.sourceFor = nil, "" // the template may have moved
	wait := slowRetry
	if !f.Stalled {
		wait = min(time.Second<<min(g.failures-1, 9), 5*time.Minute)
	}
	g.retryAt = time.Now().Add(wait)
	g.lastFailure = f
	return wait
}

// succeeded resets the backoff.
func (b *background) succeeded(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.group(key)
	g.failures, g.retryAt, g.lastFailure = 0, time.Time{}, nil
}

// backingOff returns the failure to report and the time left while the group waits after one.
func (b *background) backingOff(key types.NamespacedName) (*failure, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.group(key)
	if g.lastFailure == nil {
		return nil, 0
	}
	left := time.Until(g.retryAt)
	if left <= 0 {
		return nil, 0
	}
	return g.lastFailure, left
}
