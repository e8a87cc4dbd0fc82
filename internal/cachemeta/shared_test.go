package cachemeta

import (
	"maps"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestEqualMapsAreStoredOnceAndLetGoWithTheirObjects(t *testing.T) {
	set := NewShared(maps.Equal[map[string]string])
	object := func() *corev1.ServiceAccount {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"request": "team-a"}}}
		sa.Labels = set.Share(&sa.ObjectMeta, HashStrings(sa.Labels), sa.Labels)
		return sa
	}
	a, b := object(), object()
	if !sameMapByWrite(a.Labels, b.Labels) {
		t.Error("two equal label maps are two copies")
	}
	if set.Len() != 1 {
		t.Errorf("set holds %d values, want 1", set.Len())
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	// Once no object holds it, the value goes (cleanups run after a collection, in their own
	// goroutine).
	waitUntil(t, func() bool { return set.Len() == 0 }, "the value outlives its objects")
}

func TestAValueWhoseHashIsTakenIsNotShared(t *testing.T) {
	set := NewShared(maps.Equal[map[string]string])
	owner := &metav1.ObjectMeta{}
	first := set.Share(owner, 1, map[string]string{"a": "1"})
	other := map[string]string{"b": "2"}
	if got := set.Share(owner, 1, other); !sameMapByWrite(got, other) || got["b"] != "2" {
		t.Errorf("a different value under a taken hash came back as %v", got)
	}
	if again := set.Share(owner, 1, map[string]string{"a": "1"}); !sameMapByWrite(again, first) {
		t.Error("the value first stored under the hash is not shared")
	}
	runtime.KeepAlive(owner)
}

func TestHashStringsIgnoresOrderButNotContent(t *testing.T) {
	a := map[string]string{"x": "1", "y": "2"}
	b := map[string]string{"y": "2", "x": "1"}
	if HashStrings(a) != HashStrings(b) {
		t.Error("equal maps hash differently")
	}
	for _, c := range []map[string]string{{"x": "2", "y": "1"}, {"x": "1"}, {"x": "1", "y": "2", "z": ""}} {
		if HashStrings(a) == HashStrings(c) {
			t.Errorf("%v and %v hash the same", a, c)
		}
	}
}

func TestShareMapsSharesLabelsAndAnnotations(t *testing.T) {
	object := func() *metav1.ObjectMeta {
		return &metav1.ObjectMeta{Labels: map[string]string{"l": "1"}, Annotations: map[string]string{"a": "1"}}
	}
	a, b := object(), object()
	ShareMaps(a)
	ShareMaps(b)
	if !sameMapByWrite(a.Labels, b.Labels) || !sameMapByWrite(a.Annotations, b.Annotations) {
		t.Error("equal labels or annotations are two copies")
	}
	if a.Labels["l"] != "1" || a.Annotations["a"] != "1" || len(a.Labels) != 1 || len(a.Annotations) != 1 {
		t.Errorf("content changed: %v %v", a.Labels, a.Annotations)
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	waitUntil(t, func() bool { return stringMaps.Len() == 0 }, "the maps outlive their objects")
}

// sameMapByWrite reports whether two maps are one: a write through one shows in the other.
func sameMapByWrite(a, b map[string]string) bool {
	const probe = "\x00probe"
	a[probe] = "x"
	_, same := b[probe]
	delete(a, probe)
	return same
}

// waitUntil collects garbage until done, giving cleanups (which run in their own goroutine) a
// thousand chances.
func waitUntil(t *testing.T, done func() bool, failure string) {
	t.Helper()
	for range 1000 {
		runtime.GC()
		if done() {
			return
		}
		runtime.Gosched()
	}
	t.Fatal(failure)
}
