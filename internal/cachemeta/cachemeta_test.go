package cachemeta

import (
	"strings"
	"sync"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	toolscache "k8s.io/client-go/tools/cache"
)

// decoded returns a ConfigMap as a decoder makes it: every string its own copy.
func decoded() *corev1.ConfigMap {
	fresh := strings.Clone
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "request",
			Namespace:   fresh("requests"),
			Labels:      map[string]string{fresh("quartermaster.dev/managed-by"): fresh("quartermaster")},
			Annotations: map[string]string{fresh("quartermaster.dev/status"): fresh("Ready")},
			OwnerReferences: []metav1.OwnerReference{
				{APIVersion: fresh("v1"), Kind: fresh("Namespace"), Name: "team-a", UID: "1"},
			},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Data: map[string]string{"ttl": "1h"},
	}
}

func TestRepeatedMetadataStringsAreStoredOnce(t *testing.T) {
	a, err := Transform(decoded())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Transform(decoded())
	if err != nil {
		t.Fatal(err)
	}
	ma, mb := a.(*corev1.ConfigMap), b.(*corev1.ConfigMap)
	same := func(what, x, y string) {
		t.Helper()
		if x != y || unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s: %q and %q are two copies", what, x, y)
		}
	}
	same("namespace", ma.Namespace, mb.Namespace)
	same("owner apiVersion", ma.OwnerReferences[0].APIVersion, mb.OwnerReferences[0].APIVersion)
	same("owner kind", ma.OwnerReferences[0].Kind, mb.OwnerReferences[0].Kind)
	same("label value", ma.Labels["quartermaster.dev/managed-by"], mb.Labels["quartermaster.dev/managed-by"])
	// The map's stored keys, not the lookup key: they are what the cache keeps.
	keyOf := func(m map[string]string) string {
		for k := range m {
			return k
		}
		return ""
	}
	same("label key", keyOf(ma.Labels), keyOf(mb.Labels))
	same("annotation key", keyOf(ma.Annotations), keyOf(mb.Annotations))

	// Nothing else changes: the content is what was decoded, without managedFields.
	want := decoded()
	want.ManagedFields = nil
	if ma.Name != want.Name || ma.Namespace != want.Namespace || len(ma.Labels) != 1 || ma.Labels["quartermaster.dev/managed-by"] != "quartermaster" ||
		ma.Annotations["quartermaster.dev/status"] != "Ready" || ma.ManagedFields != nil || ma.Data["ttl"] != "1h" {
		t.Errorf("transformed = %+v, want %+v", ma, want)
	}
}

func TestOtherShapesPassThrough(t *testing.T) {
	u := &unstructured.Unstructured{}
	u.SetNamespace("requests")
	u.SetLabels(map[string]string{"a": "b"})
	for _, obj := range []any{u, toolscache.DeletedFinalStateUnknown{Key: "requests/x"}, "not an object"} {
		if _, err := Transform(obj); err != nil {
			t.Errorf("Transform(%T) = %v", obj, err)
		}
	}
	if u.GetNamespace() != "requests" || u.GetLabels()["a"] != "b" {
		t.Errorf("unstructured changed: %v", u.Object)
	}
}

// TestTransformNeverWritesIntoAMapOthersShare: a shared labels map whose strings are not (or no
// longer) the interned copies is read by other transforms at the same time; transforming an
// object that holds it gives the object a new map and leaves the shared one as it was (the race
// detector and Go's map checks see any write). A manager crashed on such a write.
func TestTransformNeverWritesIntoAMapOthersShare(t *testing.T) {
	shared := map[string]string{strings.Clone("team"): strings.Clone("payments"), strings.Clone("app"): strings.Clone("web")}
	keys := map[string]*byte{}
	for k, v := range shared {
		keys[k] = unsafe.StringData(v)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: shared, Annotations: shared}}
				if _, err := Transform(cm); err != nil {
					t.Error(err)
					return
				}
				ShareMaps(&cm.ObjectMeta)
				if cm.Labels["team"] != "payments" {
					t.Errorf("labels %v", cm.Labels)
					return
				}
			}
		})
	}
	wg.Wait()
	for k, v := range shared {
		if keys[k] != unsafe.StringData(v) {
			t.Errorf("the shared map's %q was rewritten", k)
		}
	}
}
