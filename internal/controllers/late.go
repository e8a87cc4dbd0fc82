package controllers

import (
	"context"
	"fmt"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Queue is a controller's queue, as its sources see it.
type Queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

// Late is a watch a controller is built with whose kind may be served only later (an engine's
// CRDs installed after the manager started). Until its need is met the controller runs without it;
// when the need is met, its informer starts (in the cache it was made for) and its events flow.
// When the need is met at the controller's start, the controller waits for it to sync like any
// other watch. Nothing is added to a running controller.
type Late struct {
	kinds *Kinds
	need  Need
	cache cache.Cache
	obj   client.Object
	h     handler.EventHandler
	preds []predicate.Predicate

	prepare  func(ctx context.Context) error
	appeared func(ctx context.Context, q Queue)

	atStart bool
	synced  chan error
}

var _ source.SyncingSource = &Late{}

// Watch is a Late watch of obj's kind in c, with h and preds as source.Kind takes them.
func (k *Kinds) Watch(n Need, c cache.Cache, obj client.Object, h handler.EventHandler, preds ...predicate.Predicate) *Late {
	return &Late{kinds: k, need: n, cache: c, obj: obj, h: h, preds: preds}
}

// WhenMet is a source that watches nothing: it calls appeared once n is met after the controller
// started (e.g. to reconcile what waited for an engine).
func (k *Kinds) WhenMet(n Need, appeared func(ctx context.Context, q Queue)) *Late {
	return (&Late{kinds: k, need: n}).Appeared(appeared)
}

// Prepare runs f once the need is met, before the watch starts (e.g. to add the cache's indexes
// of a kind that could not be resolved before it was served).
func (l *Late) Prepare(f func(ctx context.Context) error) *Late { l.prepare = f; return l }

// Appeared runs f with the controller's queue once the need is met after the controller started
// and the watch has delivered what exists (e.g. to reconcile every object that waited for it). A
// need met at the start calls nothing: a controller reconciles everything when it starts.
func (l *Late) Appeared(f func(ctx context.Context, q Queue)) *Late { l.appeared = f; return l }

// String names the source in the controller's logs.
func (l *Late) String() string {
	if l.obj == nil {
		return "when met: " + l.need.Name
	}
	return fmt.Sprintf("late kind source: %s (%s)", l.obj.GetObjectKind().GroupVersionKind().Kind, l.need.Name)
}

// Start starts the watch now if its need is met, or once it is; it does not block.
func (l *Late) Start(ctx context.Context, q Queue) error {
	l.atStart = l.kinds.Has(l.need)
	l.synced = make(chan error, 1)
	go func() {
		select {
		case <-l.kinds.Met(l.need):
		case <-ctx.Done():
			l.synced <- nil
			return
		}
		err := l.run(ctx, q)
		if err != nil && !l.atStart {
			l.kinds.log.Error(err, "a watch of a kind served late could not start", "source", l.String())
		}
		l.synced <- err
	}()
	return nil
}

func (l *Late) run(ctx context.Context, q Queue) error {
	if l.prepare != nil {
		if err := l.prepare(ctx); err != nil {
			return err
		}
	}
	if l.obj != nil {
		src := source.Kind[client.Object](l.cache, l.obj, l.h, l.preds...)
		if err := src.Start(ctx, q); err != nil {
			return err
		}
		if err := src.WaitForSync(ctx); err != nil {
			return err
		}
	}
	if !l.atStart && l.appeared != nil && ctx.Err() == nil {
		l.appeared(ctx, q)
	}
	return nil
}

// WaitForSync waits for the watch to deliver when its need was met at the controller's start; a
// watch whose need is not met yet holds nothing back.
func (l *Late) WaitForSync(ctx context.Context) error {
	if !l.atStart {
		return nil
	}
	select {
	case err := <-l.synced:
		return err
	case <-ctx.Done():
		return fmt.Errorf("timed out waiting for %s to sync", l.String())
	}
}
