package owned

import (
	"context"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/quartermaster-dev/quartermaster/internal/drift"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// env is the package's API server: each test keeps to a namespace of its own.
var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Package(m, &env, nil)) }

// TestEnsure drives one generated ConfigMap, controlled by another, through every outcome against
// a real API server: what each call writes is read back from the server, and the requests are
// counted (a current object costs none).
func TestEnsure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	scheme := manager.Scheme()
	cfg, counter := testenv.Counting(env.Config)
	api, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t)
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"}}
	must(t, api.Create(ctx, owner))
	// The cache a controller reads first: here one that lags behind the writer's writes until
	// caught up.
	lagging := testenv.Lagging(api)
	w := &Writer{Client: lagging, Reader: lagging, APIReader: api}

	want := func(data string) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "made", Labels: map[string]string{"app": "made"}},
			Data:       map[string]string{"key": data},
		}
		if err := controllerutil.SetControllerReference(owner, cm, scheme); err != nil {
			t.Fatal(err)
		}
		return cm
	}
	stored := func() *corev1.ConfigMap {
		cm := &corev1.ConfigMap{}
		must(t, api.Get(ctx, client.ObjectKey{Namespace: ns, Name: "made"}, cm))
		return cm
	}
	ensure := func(what string, desired *corev1.ConfigMap, o Options, wantOutcome Outcome, wantWrites int) client.Object {
		t.Helper()
		counter.Reset()
		did, obj, err := w.Ensure(ctx, desired, o)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if did != wantOutcome {
			t.Errorf("%s: %q, want %q", what, did, wantOutcome)
		}
		if got := counter.Writes(); got != wantWrites {
			t.Errorf("%s: %d writes, want %d (%v)", what, got, wantWrites, counter.Log())
		}
		return obj
	}

	obj := ensure("a new object", want("v1"), Options{}, Created, 1)
	if obj.GetAnnotations()[drift.HashAnnotation] == "" || obj.GetResourceVersion() == "" {
		t.Errorf("Created returned %v without the stored hash or resourceVersion", obj.GetAnnotations())
	}
	if m := stored().ManagedFields; len(m) != 1 || m[0].Manager != drift.FieldManager {
		t.Errorf("written by %v, want %s alone", m, drift.FieldManager)
	}

	// The reader has not seen the create: Made says the owner's status lists it, so the API server
	// is asked rather than the create repeated; without Made, the create's AlreadyExists is.
	ensure("the cache behind, Made", want("v1"), Options{Made: true}, Unchanged, 0)
	ensure("the cache behind, not Made", want("v1"), Options{}, Unchanged, 1)
	lagging.CatchUp()
	ensure("a resync of what is current", want("v1"), Options{}, Unchanged, 0)

	ensure("the want changed", want("v2"), Options{}, Updated, 1)
	if got := stored().Data["key"]; got != "v2" {
		t.Errorf("stored data %q, want v2", got)
	}
	lagging.CatchUp()

	// Someone else's edit of a content field is undone; their label and annotation are kept
	// unless the labels must be exact.
	edited := stored()
	edited.Data["key"] = "theirs"
	edited.Labels["theirs"] = "x"
	edited.Annotations["theirs"] = "y"
	must(t, client.WithFieldOwner(api, "kubectl-edit").Update(ctx, edited))
	ensure("an edit by someone else", want("v2"), Options{}, Reverted, 1)
	got := stored()
	if got.Data["key"] != "v2" || got.Labels["theirs"] != "x" || got.Annotations["theirs"] != "y" {
		t.Errorf("after the revert: data %v labels %v annotations %v; want v2 with their label and annotation kept", got.Data, got.Labels, got.Annotations)
	}
	lagging.CatchUp()
	edited = stored()
	edited.Data["key"] = "theirs again"
	must(t, client.WithFieldOwner(api, "kubectl-edit").Update(ctx, edited))
	ensure("an edit undone with exact labels", want("v2"), Options{ExactLabels: true}, Reverted, 1)
	if got := stored(); got.Labels["theirs"] != "" || got.Annotations["theirs"] != "y" {
		t.Errorf("ExactLabels: labels %v annotations %v; want their label gone, their annotation kept", got.Labels, got.Annotations)
	}
	lagging.CatchUp()
	ensure("current again", want("v2"), Options{ExactLabels: true}, Unchanged, 0)

	// A field others may write (Others) is no edit.
	edited = stored()
	edited.Data["theirs"] = "allowed"
	must(t, client.WithFieldOwner(api, "someone").Update(ctx, edited))
	ensure("a field others may write", want("v2"), Options{Others: []drift.Path{"data.theirs"}}, Unchanged, 0)

	// The name held by an object the owner does not control: left alone.
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other-owner"}}
	must(t, api.Create(ctx, other))
	foreign := stored()
	foreign.OwnerReferences = nil
	must(t, controllerutil.SetControllerReference(other, foreign, scheme))
	must(t, api.Update(ctx, foreign))
	if obj := ensure("a name taken", want("v2"), Options{}, Taken, 0); obj != nil {
		t.Errorf("Taken returned %v, want nil", obj)
	}
	if got := stored(); got.Data["key"] != "v2" || metav1.GetControllerOf(got).UID != other.UID {
		t.Error("the object in the way was changed")
	}

	// A namespace being deleted takes no new object.
	gone := env.Namespace(t)
	// No namespace controller runs here: its "kubernetes" finalizer keeps it terminating.
	must(t, api.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gone}}))
	desired := want("v1")
	desired.Namespace = gone
	counter.Reset()
	did, obj, err := w.Ensure(ctx, desired, Options{})
	if err != nil || did != Terminating || obj != nil {
		t.Errorf("in a terminating namespace: %q, %v, %v; want terminating, nil, nil", did, obj, err)
	}
	if err := api.Get(ctx, client.ObjectKeyFromObject(desired), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("the object in a terminating namespace: %v, want NotFound", err)
	}
}

// TestEnsureWithoutController: objects that have no controller (a namespace request's, in the
// namespace made for it) are written when Claims claims what holds the name: an object made by
// someone else without the owner's labels is adopted, one Claims refuses is Taken and left alone,
// and a RoleBinding whose roleRef changed (which the API server does not update) is deleted and
// made again.
func TestEnsureWithoutController(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, counter := testenv.Counting(env.Config)
	api, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	must(t, err)
	ns := env.Namespace(t)
	w := &Writer{Client: api, Reader: api, APIReader: api}
	binding := func(role string) *rbacv1.RoleBinding {
		return &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "self", Labels: map[string]string{"request": "r"}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "admin", Namespace: ns}},
		}
	}
	labelled := func(current client.Object) bool { return current.GetLabels()["request"] == "r" }
	anything := func(client.Object) bool { return true }
	stored := func() *rbacv1.RoleBinding {
		rb := &rbacv1.RoleBinding{}
		must(t, api.Get(ctx, client.ObjectKey{Namespace: ns, Name: "self"}, rb))
		return rb
	}
	ensure := func(what string, desired *rbacv1.RoleBinding, o Options, want Outcome, writes int) {
		t.Helper()
		counter.Reset()
		did, _, err := w.Ensure(ctx, desired, o)
		if err != nil || did != want || counter.Writes() != writes {
			t.Errorf("%s: %q, %v, %d writes (%v); want %q, %d writes", what, did, err, counter.Writes(), counter.Log(), want, writes)
		}
	}

	// Someone made it first, without the owner's labels.
	theirs := binding("view")
	theirs.Labels = nil
	must(t, api.Create(ctx, theirs))
	ensure("an object Claims refuses", binding("view"), Options{Claims: labelled}, Taken, 0)
	if got := stored(); got.Labels["request"] != "" {
		t.Errorf("the refused object was changed: %v", got.Labels)
	}
	ensure("an object Claims claims", binding("view"), Options{Claims: anything}, Updated, 1)
	if got := stored(); got.Labels["request"] != "r" || got.Annotations[drift.HashAnnotation] == "" {
		t.Errorf("adopted: labels %v annotations %v", got.Labels, got.Annotations)
	}
	ensure("current", binding("view"), Options{Claims: anything}, Unchanged, 0)

	roleRefChanged := func(desired, current client.Object) bool {
		return desired.(*rbacv1.RoleBinding).RoleRef != current.(*rbacv1.RoleBinding).RoleRef
	}
	uid := stored().UID
	ensure("a new roleRef", binding("edit"), Options{Claims: anything, Recreate: roleRefChanged}, Replaced, 2)
	if got := stored(); got.RoleRef.Name != "edit" || got.UID == uid {
		t.Errorf("after the roleRef change: roleRef %+v, UID %s (was %s); want edit, a new object", got.RoleRef, got.UID, uid)
	}
	ensure("current after the replacement", binding("edit"), Options{Claims: anything, Recreate: roleRefChanged}, Unchanged, 0)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
