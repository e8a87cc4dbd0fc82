package status

import (
	"context"
	"reflect"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NewClient wraps c (the manager's cached client) so that a read of an object of the given kinds
// never returns a copy older than the one this client last wrote. The informer cache catches up
// with a write some milliseconds after it; a reconcile started in between (a requeue, a watch on
// another object) would otherwise see its own previous status missing and act on it again: a
// second Event, a repeated cloud call, a folder path recomputed.
//
// It remembers the object each write returned (Create, Update, Patch, and their status
// subresource forms) and, on Get or List, hands back that copy instead of a cached one whose
// resourceVersion is older. The newer copy wins whoever wrote it, so a change by someone else
// after ours is never hidden. The guard costs no API request (an optimistic lock on the status
// patch would cost a refused patch and a whole repeated reconcile each time the cache lags).
//
// Memory: at most one copy (without managedFields) per object of the guarded kinds, dropped as soon
// as a read shows the cache has caught up, or the object is gone or deleted by this client. Each
// write also looks at the two oldest copies in the cache (no API request) and drops those it has
// caught up with, so copies of objects nobody reads again (a served request's Secret) do not pile
// up: what stays is about the writes of the last moments.
func NewClient(c client.Client, kinds ...client.Object) client.Client {
	g := &fresh{Client: c, kinds: map[reflect.Type]bool{}, last: map[writeKey]client.Object{}}
	for _, k := range kinds {
		g.kinds[reflect.TypeOf(k)] = true
	}
	return g
}

type writeKey struct {
	kind reflect.Type
	key  types.NamespacedName
}

type fresh struct {
	client.Client
	kinds map[reflect.Type]bool

	mu   sync.Mutex
	last map[writeKey]client.Object
	// order is the keys of last, oldest first (with stale duplicates of keys written again).
	order []writeKey
}

// sweepPerWrite is how many of the oldest copies each write checks against the cache: more than
// one, so that the copies shrink back after a burst of writes.
const sweepPerWrite = 2

func (f *fresh) guarded(obj runtime.Object) bool { return f.kinds[reflect.TypeOf(obj)] }

func keyOf(obj client.Object) writeKey {
	return writeKey{kind: reflect.TypeOf(obj), key: client.ObjectKeyFromObject(obj)}
}

// remember keeps what a successful write returned, and sweeps.
func (f *fresh) remember(ctx context.Context, obj client.Object) {
	if !f.guarded(obj) || obj.GetResourceVersion() == "" {
		return
	}
	c := obj.DeepCopyObject().(client.Object)
	c.SetManagedFields(nil)
	k := keyOf(obj)
	f.mu.Lock()
	f.last[k] = c
	f.order = append(f.order, k)
	f.mu.Unlock()
	f.sweep(ctx)
}

// sweep drops the oldest copies the cache has caught up with (or whose object is gone); one it
// has not caught up with yet goes to the back of the line.
func (f *fresh) sweep(ctx context.Context) {
	for checked := 0; checked < sweepPerWrite; {
		f.mu.Lock()
		if len(f.order) == 0 {
			f.mu.Unlock()
			return
		}
		k := f.order[0]
		f.order = f.order[1:]
		w, ok := f.last[k]
		f.mu.Unlock()
		if !ok {
			continue // dropped already: a stale entry of the line
		}
		checked++
		cached := reflect.New(k.kind.Elem()).Interface().(client.Object)
		err := f.Client.Get(ctx, k.key, cached)
		f.mu.Lock()
		if f.last[k] == w { // not written again meanwhile (a newer copy has its own place)
			if caughtUp(w, cached, err) {
				delete(f.last, k)
			} else {
				f.order = append(f.order, k)
			}
		}
		f.mu.Unlock()
	}
}

// caughtUp says whether a copy we wrote can go, given what the cache read returned.
func caughtUp(written, cached client.Object, err error) bool {
	switch {
	case apierrors.IsNotFound(err):
		return true
	case err != nil:
		return false
	case written.GetUID() != cached.GetUID():
		return true
	}
	newer, err := resourceversion.CompareResourceVersion(written.GetResourceVersion(), cached.GetResourceVersion())
	return err != nil || newer <= 0
}

func (f *fresh) forget(obj client.Object) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.last, keyOf(obj))
}

// freshen replaces obj, just read, by the copy this client last wrote when that one is newer, and
// drops a copy the cache has caught up with.
func (f *fresh) freshen(obj client.Object) {
	k := keyOf(obj)
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.last[k]
	if !ok {
		return
	}
	if w.GetUID() != obj.GetUID() {
		delete(f.last, k) // deleted and created again: our write was of another object
		return
	}
	newer, err := resourceversion.CompareResourceVersion(w.GetResourceVersion(), obj.GetResourceVersion())
	if err != nil || newer <= 0 {
		delete(f.last, k)
		return
	}
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(w.DeepCopyObject()).Elem())
}

func (f *fresh) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := f.Client.Get(ctx, key, obj, opts...)
	if !f.guarded(obj) {
		return err
	}
	switch {
	case err == nil:
		f.freshen(obj)
	case apierrors.IsNotFound(err):
		f.mu.Lock()
		delete(f.last, writeKey{kind: reflect.TypeOf(obj), key: key})
		f.mu.Unlock()
	}
	return err
}

func (f *fresh) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := f.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	return meta.EachListItem(list, func(o runtime.Object) error {
		if obj, ok := o.(client.Object); ok && f.guarded(obj) {
			f.freshen(obj)
		}
		return nil
	})
}

func (f *fresh) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := f.Client.Create(ctx, obj, opts...)
	if err == nil {
		f.remember(ctx, obj)
	}
	return err
}

func (f *fresh) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	err := f.Client.Update(ctx, obj, opts...)
	if err == nil {
		f.remember(ctx, obj)
	}
	return err
}

func (f *fresh) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	err := f.Client.Patch(ctx, obj, patch, opts...)
	if err == nil {
		f.remember(ctx, obj)
	}
	return err
}

func (f *fresh) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	err := f.Client.Delete(ctx, obj, opts...)
	if f.guarded(obj) {
		// Deleted, or going (finalizers): the cache's next copy says which.
		f.forget(obj)
	}
	return err
}

func (f *fresh) Status() client.SubResourceWriter { return f.SubResource("status") }

func (f *fresh) SubResource(name string) client.SubResourceClient {
	return &freshSubResource{SubResourceClient: f.Client.SubResource(name), f: f}
}

// freshSubResource remembers what status writes return (Create of a subresource returns the
// subresource, a token or an eviction, not the object: it passes through).
type freshSubResource struct {
	client.SubResourceClient
	f *fresh
}

func (s *freshSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	err := s.SubResourceClient.Update(ctx, obj, opts...)
	if err == nil {
		s.f.remember(ctx, obj)
	}
	return err
}

func (s *freshSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	err := s.SubResourceClient.Patch(ctx, obj, patch, opts...)
	if err == nil {
		s.f.remember(ctx, obj)
	}
	return err
}
