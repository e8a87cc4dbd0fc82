package testenv

import (
	"context"
	"reflect"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// LaggingClient is a client whose reads lag behind its own writes, as an informer cache does for
// the milliseconds before it sees them: every object written through it since the last CatchUp is
// read as it was before its first write (absent, if the write created it). Writes go to the API
// server at once. Tests use it to show a reconciler does not act twice on a stale copy.
type LaggingClient struct {
	client.Client

	mu     sync.Mutex
	before map[lagKey]client.Object // nil value: did not exist before
}

type lagKey struct {
	kind reflect.Type
	key  types.NamespacedName
}

// Lagging wraps c.
func Lagging(c client.Client) *LaggingClient {
	return &LaggingClient{Client: c, before: map[lagKey]client.Object{}}
}

// CatchUp makes reads current again, as the cache is once the watch delivers the writes.
func (l *LaggingClient) CatchUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.before)
}

// Lags reports how many objects are read as older than they are.
func (l *LaggingClient) Lags() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.before)
}

// snapshot records obj as it is on the server before its first write since CatchUp.
func (l *LaggingClient) snapshot(ctx context.Context, obj client.Object) {
	k := lagKey{reflect.TypeOf(obj), client.ObjectKeyFromObject(obj)}
	l.mu.Lock()
	_, seen := l.before[k]
	l.mu.Unlock()
	if seen {
		return
	}
	cur := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(client.Object)
	var old client.Object
	if err := l.Client.Get(ctx, k.key, cur); err == nil {
		old = cur
	}
	l.mu.Lock()
	l.before[k] = old
	l.mu.Unlock()
}

// Get reads obj as it was before the writes since CatchUp.
func (l *LaggingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	l.mu.Lock()
	old, lagging := l.before[lagKey{reflect.TypeOf(obj), key}]
	l.mu.Unlock()
	if !lagging {
		return l.Client.Get(ctx, key, obj, opts...)
	}
	if old == nil {
		gvk, _ := l.GroupVersionKindFor(obj)
		return apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: gvk.Kind}, key.Name)
	}
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(old.DeepCopyObject()).Elem())
	return nil
}

// List lists objects as they were before the writes since CatchUp (without those created since).
func (l *LaggingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := l.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	kept := items[:0]
	l.mu.Lock()
	for _, item := range items {
		obj := item.(client.Object)
		old, lagging := l.before[lagKey{reflect.TypeOf(obj), client.ObjectKeyFromObject(obj)}]
		switch {
		case !lagging:
			kept = append(kept, obj)
		case old != nil:
			kept = append(kept, old.DeepCopyObject())
		}
	}
	l.mu.Unlock()
	return meta.SetList(list, kept)
}

// Create creates obj; reads show it absent until CatchUp.
func (l *LaggingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	l.snapshot(ctx, obj)
	return l.Client.Create(ctx, obj, opts...)
}

// Update updates obj; reads show the old copy until CatchUp.
func (l *LaggingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	l.snapshot(ctx, obj)
	return l.Client.Update(ctx, obj, opts...)
}

// Patch patches obj; reads show the old copy until CatchUp.
func (l *LaggingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	l.snapshot(ctx, obj)
	return l.Client.Patch(ctx, obj, patch, opts...)
}

// Status writes the status subresource, lagging as Update and Patch do.
func (l *LaggingClient) Status() client.SubResourceWriter { return l.SubResource("status") }

// SubResource is a subresource client whose Update and Patch lag as the object's do.
func (l *LaggingClient) SubResource(name string) client.SubResourceClient {
	return &laggingSubResource{SubResourceClient: l.Client.SubResource(name), l: l}
}

type laggingSubResource struct {
	client.SubResourceClient
	l *LaggingClient
}

func (s *laggingSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.l.snapshot(ctx, obj)
	return s.SubResourceClient.Update(ctx, obj, opts...)
}

func (s *laggingSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.l.snapshot(ctx, obj)
	return s.SubResourceClient.Patch(ctx, obj, patch, opts...)
}
