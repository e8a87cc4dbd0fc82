// Package owned creates and repairs the objects a controller generates: the one create-or-update
// path of every controller (the intents engine policies and NimbusPolicies, a registry mirror's
// StatefulSet, Services, Secret…, a namespace request's RBAC, defaults and credentials Secret, the
// IAM compatibility mode's objects). What counts as drift is internal/drift's rule; this package
// reads, writes (as drift.FieldManager), handles a cache that lags, takes over the fields
// another writer owns when it repairs their edit, replaces an object whose immutable fields
// changed (Options.Recreate), and tells whose an object is: its controller reference, or
// Options.Claims for objects without one. Objects made once and handed over, never kept to a want
// (a requested Namespace, the ServiceAccount an IAMServiceAccount creates), do not come here: they
// are created, and their annotations written, with WithFieldOwner.
package owned

import (
	"context"
	"fmt"
	"maps"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/drift"
)

// Writer writes generated objects, always as drift.FieldManager (the drift rule tells our
// writes from others' by it). Reader is where current objects are read first (a cache whose
// transform keeps drift.Summary, as cachemeta.Transform does), APIReader where a cache that
// may lag is checked.
type Writer struct {
	Client    client.Client
	Reader    client.Reader
	APIReader client.Reader
}

// WithFieldOwner is c writing as drift.FieldManager, as a Writer writes: a controller's other
// writes of generated objects must use it too.
func WithFieldOwner(c client.Client) client.Client {
	return client.WithFieldOwner(c, drift.FieldManager)
}

// Outcome is what Ensure found and did.
type Outcome string

// The outcomes.
const (
	Unchanged   Outcome = ""
	Created     Outcome = "created"
	Updated     Outcome = "updated"  // the want changed
	Reverted    Outcome = "reverted" // someone's edit was undone
	Replaced    Outcome = "replaced" // deleted and created again (Options.Recreate)
	Taken       Outcome = "taken"    // the name is held by an object the owner does not control
	Terminating Outcome = "terminating"
)

// Options are how one kind of object is written.
type Options struct {
	// Made says the owner's status lists the object as made. The status is read through the
	// guarded client, never older than our own last write: when the cache does not show the
	// object, it is behind the create that made it (or someone deleted it since), and the API
	// server is asked before creating, rather than repeating the create for a refusal.
	Made bool
	// ExactLabels: the object's labels are exactly desired's (a binding's labels copied onto its
	// NimbusPolicy). Otherwise others' labels are kept, as others' annotations always are.
	ExactLabels bool
	// Others are the fields others may write without it counting as an edit (drift.Edits).
	Others []drift.Path
	// Prepare adjusts the update of current to desired: fields an update may not change, fields
	// others set that must be kept.
	Prepare func(desired, current client.Object)
	// Recreate reports whether current must be deleted and desired created in its place, for a
	// field the API server does not update (a RoleBinding's roleRef), as Flux's ssa replaces an
	// object whose immutable fields changed.
	Recreate func(desired, current client.Object) bool
	// Claims, for objects with no controller reference, says whether an existing object is the
	// owner's to write (a namespace request's objects: any in the namespace made for it; its
	// credentials Secret: one with the request's labels); one it does not claim is Taken. Nil:
	// desired carries its controller reference, and a name held by an object another controls is
	// Taken.
	Claims func(current client.Object) bool
}

// Ensure brings the object desired names to desired, which must carry its controller reference
// (unless Options.Claims says which objects are the owner's). It returns what it did and the object as stored (nil when Taken
// or Terminating). A current object makes no write.
func (w *Writer) Ensure(ctx context.Context, desired client.Object, o Options) (Outcome, client.Object, error) {
	if err := drift.Stamp(desired); err != nil {
		return "", nil, err
	}
	writes := WithFieldOwner(w.Client)
	key := client.ObjectKeyFromObject(desired)
	current := newLike(desired)
	err := w.Reader.Get(ctx, key, current)
	if apierrors.IsNotFound(err) && o.Made {
		err = w.APIReader.Get(ctx, key, current)
	}
	if apierrors.IsNotFound(err) {
		created := desired.DeepCopyObject().(client.Object)
		err = writes.Create(ctx, created)
		switch {
		case err == nil:
			return Created, created, nil
		case apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			return Terminating, nil, nil
		case !apierrors.IsAlreadyExists(err):
			return "", nil, err
		}
		// The name exists though the cache does not show it: the cache is behind (our own create
		// of a moment ago, say), or the object is someone else's. Ask the API server.
		err = w.APIReader.Get(ctx, key, current)
	}
	if err != nil {
		return "", nil, err
	}
	if o.Claims != nil {
		if !o.Claims(current) {
			return Taken, nil, nil
		}
	} else if want, have := metav1.GetControllerOfNoCopy(desired), metav1.GetControllerOfNoCopy(current); have == nil || want == nil || have.UID != want.UID {
		return Taken, nil, nil
	}
	if drift.Current(desired, current, o.Others...) {
		return Unchanged, current, nil
	}
	if o.Recreate != nil && o.Recreate(desired, current) {
		return w.replace(ctx, writes, desired, current)
	}
	var ownership []metav1.ManagedFieldsEntry
	if len(drift.Edits(current.GetManagedFields(), o.Others...)) > 0 {
		// Another writer owns content fields. Those whose values this update does not change
		// would stay theirs and read as their edit at every later look: the update takes them
		// over (drift.TakeEdits of the object's whole managedFields, read from the API
		// server: a cache keeps a summary).
		live := newLike(desired)
		if err := w.APIReader.Get(ctx, key, live); err != nil {
			return "", nil, err
		}
		current, ownership = live, drift.TakeEdits(live.GetManagedFields(), o.Others...)
	}
	update := desired.DeepCopyObject().(client.Object)
	update.SetResourceVersion(current.GetResourceVersion())
	update.SetFinalizers(current.GetFinalizers())
	if !o.ExactLabels {
		update.SetLabels(Merged(current.GetLabels(), desired.GetLabels()))
	}
	update.SetAnnotations(Merged(current.GetAnnotations(), desired.GetAnnotations()))
	if o.Prepare != nil {
		o.Prepare(update, current)
	}
	update.SetManagedFields(ownership) // nil: the API server keeps the object's
	did := Updated
	if current.GetAnnotations()[drift.HashAnnotation] == desired.GetAnnotations()[drift.HashAnnotation] {
		did = Reverted // the same want: what differs is someone else's doing
	}
	if err := writes.Update(ctx, update); err != nil {
		return "", nil, fmt.Errorf("updating %s %s: %w", Kind(desired), key, err)
	}
	return did, update, nil
}

// replace deletes current (that very object: a precondition on its UID and resourceVersion) and
// creates desired in its place.
func (w *Writer) replace(ctx context.Context, writes client.Client, desired, current client.Object) (Outcome, client.Object, error) {
	uid, version := current.GetUID(), current.GetResourceVersion()
	err := writes.Delete(ctx, current, client.Preconditions{UID: &uid, ResourceVersion: &version})
	if client.IgnoreNotFound(err) != nil {
		return "", nil, fmt.Errorf("deleting %s %s to create it anew: %w", Kind(desired), client.ObjectKeyFromObject(desired), err)
	}
	created := desired.DeepCopyObject().(client.Object)
	created.SetResourceVersion("")
	if err := writes.Create(ctx, created); err != nil {
		return "", nil, fmt.Errorf("creating %s %s anew: %w", Kind(desired), client.ObjectKeyFromObject(desired), err)
	}
	return Replaced, created, nil
}

// newLike returns an empty object of obj's type (and, unstructured, its kind).
func newLike(obj client.Object) client.Object {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		out := &unstructured.Unstructured{}
		out.SetGroupVersionKind(u.GroupVersionKind())
		return out
	}
	return reflect.New(reflect.TypeOf(obj).Elem()).Interface().(client.Object)
}

// Kind is obj's kind, for messages.
func Kind(obj client.Object) string {
	if k := obj.GetObjectKind().GroupVersionKind().Kind; k != "" {
		return k
	}
	return reflect.TypeOf(obj).Elem().Name()
}

// Merged is base with over's entries added or replacing base's: how an update keeps others' labels
// and annotations (and a pod template's annotations others set, for a controller's Prepare).
func Merged(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	maps.Copy(out, base)
	maps.Copy(out, over)
	return out
}

// Rejected reports an answer that retrying the same object cannot change: the object is invalid
// or an admission webhook refuses it.
func Rejected(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)
}
