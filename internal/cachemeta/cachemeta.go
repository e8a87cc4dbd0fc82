// Package cachemeta is the transform every informer cache of the manager applies to the objects it
// stores: what no controller reads is dropped, and the metadata strings that repeat across objects
// are stored once.
package cachemeta

import (
	"unique"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// Transform drops an object's managedFields (as cache.TransformStripManagedFields does) and makes
// the strings its metadata shares with thousands of other cached objects point to one copy: label
// keys and values, annotation keys, the namespace, its own and its owners' apiVersion and kind.
// Decoding gives every object its own copy of each ("quartermaster.dev/managed-by" once per
// object, say), which on a cluster with thousands of served requests is megabytes of the live
// heap. Annotation values (timestamps, UIDs, messages) and names are mostly unique and are left
// alone. Maps and specs that repeat are shared by the controllers that know they do (Shared).
func Transform(obj any) (any, error) {
	obj, err := cache.TransformStripManagedFields()(obj)
	if err != nil {
		return obj, err
	}
	m, ok := obj.(metav1.Object)
	if _, unstructured := obj.(runtime.Unstructured); !ok || unstructured {
		// Tombstones have no metadata; an unstructured object's getters return copies, so its
		// strings could not be replaced in place.
		return obj, nil
	}
	if t, ok := obj.(runtime.Object); ok {
		if tm, ok := t.GetObjectKind().(*metav1.TypeMeta); ok {
			tm.APIVersion, tm.Kind = Intern(tm.APIVersion), Intern(tm.Kind)
		}
	}
	m.SetNamespace(Intern(m.GetNamespace()))
	internMap(m.GetLabels(), true)
	internMap(m.GetAnnotations(), false)
	owners := m.GetOwnerReferences()
	for i := range owners {
		owners[i].APIVersion = Intern(owners[i].APIVersion)
		owners[i].Kind = Intern(owners[i].Kind)
	}
	return obj, nil
}

// internMap replaces m's keys (and its values, with values) by their shared copies, in place:
// assigning to an existing string key stores the new key's bytes too.
func internMap(m map[string]string, values bool) {
	for k, v := range m {
		if values {
			v = Intern(v)
		}
		m[Intern(k)] = v
	}
}

// Intern returns the shared copy of s.
func Intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}
