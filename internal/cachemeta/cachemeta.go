// Package cachemeta is the transform every informer cache of the manager applies to the objects it
// stores: what no controller reads is dropped, and the metadata strings that repeat across objects
// are stored once.
package cachemeta

import (
	"unique"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quartermaster-dev/quartermaster/internal/drift"
)

// Transform drops an object's managedFields (as cache.TransformStripManagedFields does; of an object
// a controller generated it keeps drift.Summary, usually nothing) and makes
// the strings its metadata shares with thousands of other cached objects point to one copy: label
// keys and values, annotation keys, the namespace, its own and its owners' apiVersion and kind.
// Decoding gives every object its own copy of each ("quartermaster.dev/managed-by" once per
// object, say), which on a cluster with thousands of served requests is megabytes of the live
// heap. Annotation values (timestamps, UIDs, messages) and names are mostly unique and are left
// alone. Maps and specs that repeat are shared by the controllers that know they do (Shared).
func Transform(obj any) (any, error) {
	m, ok := obj.(metav1.Object)
	if ok && len(m.GetManagedFields()) > 0 {
		// A generated object keeps what shows someone else's edits (usually nothing): the drift
		// rule reads it (drift.Current).
		var keep []metav1.ManagedFieldsEntry
		if _, ours := m.GetAnnotations()[drift.HashAnnotation]; ours {
			keep = drift.Summary(m.GetManagedFields())
		}
		m.SetManagedFields(keep)
	}
	if _, unstructured := obj.(runtime.Unstructured); !ok || unstructured {
		// Tombstones have no metadata; an unstructured object's getters return copies, so its
		// strings could not be replaced in place.
		return obj, nil
	}
	if t, ok := obj.(runtime.Object); ok {
		if tm, ok := t.GetObjectKind().(*metav1.TypeMeta); ok {
			InternAt(&tm.APIVersion)
			InternAt(&tm.Kind)
		}
	}
	if ns, shared := m.GetNamespace(), Intern(m.GetNamespace()); !sameString(ns, shared) {
		m.SetNamespace(shared)
	}
	if labels := internMap(m.GetLabels(), true); !sameMap(labels, m.GetLabels()) {
		m.SetLabels(labels)
	}
	if annotations := internMap(m.GetAnnotations(), false); !sameMap(annotations, m.GetAnnotations()) {
		m.SetAnnotations(annotations)
	}
	owners := m.GetOwnerReferences()
	for i := range owners {
		InternAt(&owners[i].APIVersion)
		InternAt(&owners[i].Kind)
	}
	return obj, nil
}

// internMap returns m with its keys (and its values, with values) replaced by their shared
// copies: m itself when they are all shared already, else a new map. It never writes into m: m
// may be a map other cached objects share (cachemeta.Shared), read by other objects' transforms at
// the same time. (A string interned before may have a new shared copy now: unique keeps a
// canonical copy only while a handle to it lives, and a map holding the old copy keeps no handle.
// Writing into m then crashed a manager: concurrent map iteration and map write.)
func internMap(m map[string]string, values bool) map[string]string {
	interned := func(k, v string) (string, string) {
		if values {
			v = Intern(v)
		}
		return Intern(k), v
	}
	for k, v := range m {
		if nk, nv := interned(k, v); !sameString(nk, k) || !sameString(nv, v) {
			out := make(map[string]string, len(m))
			for k, v := range m {
				nk, nv := interned(k, v)
				out[nk] = nv
			}
			return out
		}
	}
	return m
}

// InternAt makes *s its shared copy, writing only when it is not one already.
func InternAt(s *string) {
	if shared := Intern(*s); !sameString(shared, *s) {
		*s = shared
	}
}

func sameString(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// Intern returns the shared copy of s.
func Intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}
