package cachemeta

import (
	"hash/maphash"
	"maps"
	"reflect"
	"runtime"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Shared is a set of values that equal cached objects use one copy of. Objects made for one
// namespace request carry the same labels and annotations, and the LimitRange of every requested
// namespace has the same spec; decoding gives each object its own maps and slices (a small map alone
// is about 300 bytes). A value stays in the set while an object holding it is alive: Share
// registers a cleanup on the object's metadata that lets go of the value.
//
// A shared value must never be changed. That holds for objects in controller-runtime's cache: its
// readers return deep copies, and event handlers only read what they are given.
type Shared[V any] struct {
	equal   func(a, b V) bool
	mu      sync.Mutex
	entries map[uint64]*entry[V]
}

type entry[V any] struct {
	value V
	users int
}

// NewShared returns an empty set whose values are compared with equal.
func NewShared[V any](equal func(a, b V) bool) *Shared[V] {
	return &Shared[V]{equal: equal, entries: map[uint64]*entry[V]{}}
}

// Share returns the set's copy of v, whose hash is h, and holds it for as long as owner (the metadata
// of the object that will hold it) is reachable. A value whose hash is taken by a different value is
// returned unchanged and not held.
func (s *Shared[V]) Share(owner *metav1.ObjectMeta, h uint64, v V) V {
	v, held := s.hold(h, v)
	if held {
		runtime.AddCleanup(owner, s.release, h)
	}
	return v
}

// hold returns the set's copy of v and whether it is held for the caller, who must then release h
// once.
func (s *Shared[V]) hold(h uint64, v V) (V, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[h]
	switch {
	case !ok:
		e = &entry[V]{value: v}
		s.entries[h] = e
	case !s.equal(e.value, v):
		return v, false
	}
	e.users++
	return e.value, true
}

func (s *Shared[V]) release(h uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[h]; e != nil {
		if e.users--; e.users == 0 {
			delete(s.entries, h)
		}
	}
}

// Len is the number of values held.
func (s *Shared[V]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

var seed = maphash.MakeSeed()

// HashStrings hashes a map of strings independently of its iteration order.
func HashStrings(m map[string]string) uint64 {
	h := uint64(len(m))
	for k, v := range m {
		h += maphash.Comparable(seed, [2]string{k, v})
	}
	return h
}

// HashBytes hashes b, an object's encoding.
func HashBytes(b []byte) uint64 { return maphash.Bytes(seed, b) }

// stringMaps holds the label and annotation maps of every cached object.
var stringMaps = NewShared(maps.Equal[map[string]string])

// heldMaps are the hashes of the maps one object holds, released together when it is collected
// (one cleanup per object rather than one per map: each costs a record of its own).
type heldMaps struct {
	labels, annotations       uint64
	hasLabels, hasAnnotations bool
}

// ShareMaps makes m's labels and annotations the shared copies of equal maps. It pays where many
// cached objects carry the same maps (the objects made for one request carry the same labels and
// annotations); for a unique map it costs the set's entry and a cleanup.
func ShareMaps(m *metav1.ObjectMeta) {
	var held heldMaps
	// Assigned only when it changes: an object may be transformed again while others read it.
	var shared map[string]string
	if len(m.Labels) > 0 {
		held.labels = HashStrings(m.Labels)
		if shared, held.hasLabels = stringMaps.hold(held.labels, m.Labels); !sameMap(shared, m.Labels) {
			m.Labels = shared
		}
	}
	if len(m.Annotations) > 0 {
		held.annotations = HashStrings(m.Annotations)
		if shared, held.hasAnnotations = stringMaps.hold(held.annotations, m.Annotations); !sameMap(shared, m.Annotations) {
			m.Annotations = shared
		}
	}
	if held.hasLabels || held.hasAnnotations {
		runtime.AddCleanup(m, releaseMaps, held)
	}
}

func sameMap(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func releaseMaps(held heldMaps) {
	if held.hasLabels {
		stringMaps.release(held.labels)
	}
	if held.hasAnnotations {
		stringMaps.release(held.annotations)
	}
}
