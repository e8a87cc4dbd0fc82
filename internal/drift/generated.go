// Package drift decides whether an object a controller generated is still what it generated,
// without mistaking the API server's defaults for an edit. One rule for every object a controller
// makes (internal/controller/owned writes them all: engine policies, NimbusPolicies, a mirror's
// StatefulSet, a namespace request's RBAC and defaults, the IAM compatibility mode's objects):
//
//   - what the controller wants is recorded as a hash in the object's HashAnnotation when it writes
//     it: a changed hash is a changed want (a field dropped from the want shows there too, where
//     comparing stored and wanted values cannot tell a dropped field from a defaulted one);
//   - what someone else did shows in the object's managedFields: a writer other than FieldManager
//     owning a field of the object's content (spec, data, rules…) edited it, since the API server
//     attributes a field to whoever last changed it. Defaults are never anyone's edit: the server
//     fills them in while our own write is stored, or for nobody. Status writes (an engine
//     reporting Ready) are the status subresource's and do not count.
//
// No value is compared, so no schema is needed and a new engine version that defaults a new field
// changes nothing.
package drift

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// FieldManager is the name every write of a generated object is made under.
const FieldManager = "quartermaster"

// HashAnnotation holds the hash of what the controller last wrote (Hash).
const HashAnnotation = "quartermaster.dev/generated"

// Object is what the rule reads of an object: its metadata and content.
type Object interface {
	metav1.Object
	runtime.Object
}

// Hash is the hash of what desired says: its labels, annotations (but HashAnnotation), controller
// and every top-level field but metadata and status, written relative to the object's namespace:
// wherever the want says the namespace's name, the hash reads a mark instead. An object's
// namespace is part of its name, so the hash still changes exactly when the want does (the JSON
// text has no raw NUL, the mark, so the rewriting is one-to-one); but objects made alike in many
// namespaces (a namespace request's RBAC, whose subjects and labels name the namespace) carry one
// hash, and the cache keeps one copy of their annotations (cachemeta.ShareMaps).
//
// The content is the object's own JSON (content), as the API server is sent it: a hash of every
// desired object is taken at every reconcile, so it is not converted to another form first.
func Hash(desired Object) (string, error) {
	body, err := content(desired)
	if err != nil {
		return "", err
	}
	annotations := maps.Clone(desired.GetAnnotations())
	delete(annotations, HashAnnotation)
	if len(annotations) == 0 {
		annotations = nil
	}
	labels := desired.GetLabels()
	if len(labels) == 0 {
		labels = nil
	}
	var controller string
	if ref := metav1.GetControllerOfNoCopy(desired); ref != nil {
		controller = ref.Kind + "/" + ref.Name + "/" + string(ref.UID)
	}
	b, err := json.Marshal([]any{labels, annotations, controller})
	if err != nil {
		return "", err
	}
	b = append(append(append(b[:len(b)-1], ','), body...), ']') // [labels, annotations, controller, content]
	if ns := desired.GetNamespace(); ns != "" {
		b = bytes.ReplaceAll(b, []byte(ns), []byte{0})
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12]), nil
}

// content is desired's JSON without its metadata and status: an unstructured object's map without
// those keys, a typed object (a pointer to a struct embedding ObjectMeta) as a copy with its
// ObjectMeta and Status fields zero, which encode the same for every object of the type.
func content(desired Object) ([]byte, error) {
	if u, ok := desired.(runtime.Unstructured); ok {
		m := maps.Clone(u.UnstructuredContent()) // an unstructured object's own map
		delete(m, "metadata")
		delete(m, "status")
		return json.Marshal(m)
	}
	v := reflect.ValueOf(desired)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("hashing %T: not a pointer to a struct", desired)
	}
	c := reflect.New(v.Elem().Type())
	c.Elem().Set(v.Elem()) // a shallow copy: desired itself is not changed
	for _, name := range []string{"ObjectMeta", "Status"} {
		if f := c.Elem().FieldByName(name); f.IsValid() && f.CanSet() {
			f.SetZero()
		}
	}
	return json.Marshal(c.Interface())
}

// Stamp records desired's Hash in its HashAnnotation, before it is written.
func Stamp(desired Object) error {
	h, err := Hash(desired)
	if err != nil {
		return err
	}
	annotations := maps.Clone(desired.GetAnnotations())
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[HashAnnotation] = h
	desired.SetAnnotations(annotations)
	return nil
}

// Current reports whether live is still what stamped (desired after Stamp) says: the same hash,
// its labels and annotations present, the same controller, and no content field edited by anyone
// else (Edits). others lists the field paths others may write (see Edits).
func Current(stamped, live metav1.Object, others ...Path) bool {
	for k, v := range stamped.GetLabels() {
		if got, ok := live.GetLabels()[k]; !ok || got != v {
			return false
		}
	}
	for k, v := range stamped.GetAnnotations() {
		if got, ok := live.GetAnnotations()[k]; !ok || got != v {
			return false
		}
	}
	want, got := metav1.GetControllerOfNoCopy(stamped), metav1.GetControllerOfNoCopy(live)
	if (want == nil) != (got == nil) || want != nil && (want.UID != got.UID || want.Kind != got.Kind) {
		return false
	}
	return len(Edits(live.GetManagedFields(), others...)) == 0
}

// Path is a field path others may write without it counting as an edit, as dot-separated field
// names ("spec.template.metadata.annotations": kubectl rollout restart's).
type Path string

// Edits returns the writers other than FieldManager that own a content field of the object (any
// field but metadata, status, apiVersion and kind, outside the paths others may write), in
// managedFields order.
func Edits(entries []metav1.ManagedFieldsEntry, others ...Path) []string {
	var out []string
	for _, e := range entries {
		if e.Manager == FieldManager || e.Subresource != "" || e.FieldsV1 == nil {
			continue
		}
		fields := map[string]any{}
		if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields); err != nil {
			out = append(out, e.Manager) // unreadable: it cannot be shown to be harmless
			continue
		}
		for _, p := range others {
			drop(fields, strings.Split(string(p), "."))
		}
		for k, v := range fields {
			if !metaField(k) && owns(v) {
				out = append(out, e.Manager)
				break
			}
		}
	}
	return out
}

// TakeEdits is entries with the content fields Edits counts moved from the writers who own them
// to FieldManager (their metadata and the paths others may write stay theirs; an entry left with
// nothing goes). An update that sends it as the object's managedFields takes those fields over:
// a field whose value an update does not change keeps its owner otherwise, and would read as
// their edit at every later look (an adopted object, one written under another field manager).
func TakeEdits(entries []metav1.ManagedFieldsEntry, others ...Path) []metav1.ManagedFieldsEntry {
	out := make([]metav1.ManagedFieldsEntry, 0, len(entries)+1)
	taken := map[string]map[string]any{} // apiVersion → the fields taken
	for _, e := range entries {
		if len(Edits([]metav1.ManagedFieldsEntry{e}, others...)) == 0 {
			out = append(out, e)
			continue
		}
		fields := map[string]any{}
		if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields); err != nil {
			continue // unreadable: nothing of it can be kept
		}
		kept := map[string]any{}
		for k, v := range fields {
			if metaField(k) {
				kept[k] = v
			}
		}
		for _, p := range others {
			keep(kept, fields, strings.Split(string(p), "."))
		}
		if taken[e.APIVersion] == nil {
			taken[e.APIVersion] = map[string]any{}
		}
		for k, v := range fields {
			if !metaField(k) {
				mergeFields(taken[e.APIVersion], map[string]any{k: v})
			}
		}
		for _, p := range others {
			drop(taken[e.APIVersion], strings.Split(string(p), "."))
		}
		if len(kept) == 0 {
			continue
		}
		if raw, err := json.Marshal(kept); err == nil {
			e.FieldsV1 = metav1.NewFieldsV1(string(raw))
			out = append(out, e)
		}
	}
	for version, fields := range taken {
		ours := slices.IndexFunc(out, func(e metav1.ManagedFieldsEntry) bool {
			return e.Manager == FieldManager && e.Operation == metav1.ManagedFieldsOperationUpdate && e.Subresource == "" && e.APIVersion == version
		})
		if ours < 0 {
			out = append(out, metav1.ManagedFieldsEntry{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: version, FieldsType: "FieldsV1"})
			ours = len(out) - 1
		} else {
			mine := map[string]any{}
			if err := json.Unmarshal(out[ours].FieldsV1.GetRawBytes(), &mine); err == nil {
				mergeFields(fields, mine)
			}
		}
		if raw, err := json.Marshal(fields); err == nil {
			out[ours].FieldsV1 = metav1.NewFieldsV1(string(raw))
		}
	}
	return out
}

// mergeFields adds the fieldsV1 tree from into into.
func mergeFields(into, from map[string]any) {
	for k, v := range from {
		sub, isMap := v.(map[string]any)
		have, hasMap := into[k].(map[string]any)
		if isMap && hasMap {
			mergeFields(have, sub)
			continue
		}
		if _, exists := into[k]; !exists || isMap {
			into[k] = v
		}
	}
}

// keep copies the subtree at path (field names) from fields into kept.
func keep(kept, fields map[string]any, path []string) {
	key := "f:" + path[0]
	v, ok := fields[key]
	if !ok {
		return
	}
	if len(path) == 1 {
		kept[key] = v
		return
	}
	sub, ok := v.(map[string]any)
	if !ok {
		return
	}
	into, _ := kept[key].(map[string]any)
	if into == nil {
		into = map[string]any{}
	}
	keep(into, sub, path[1:])
	if len(into) > 0 {
		kept[key] = into
	}
}

// Summary is what a cache keeps of an object's managedFields for Current: the entries that are
// edits (Edits, with no paths allowed), with only their content fields. Usually nothing.
func Summary(entries []metav1.ManagedFieldsEntry) []metav1.ManagedFieldsEntry {
	var out []metav1.ManagedFieldsEntry
	for _, e := range entries {
		if len(Edits([]metav1.ManagedFieldsEntry{e})) == 0 {
			continue
		}
		fields := map[string]any{}
		if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields); err == nil {
			for k := range fields {
				if metaField(k) {
					delete(fields, k)
				}
			}
			if raw, err := json.Marshal(fields); err == nil {
				e.FieldsV1 = metav1.NewFieldsV1(string(raw))
			}
		}
		e.Time = nil
		out = append(out, e)
	}
	return out
}

func metaField(k string) bool {
	switch k {
	case "f:metadata", "f:status", "f:apiVersion", "f:kind", ".":
		return true
	}
	return false
}

// owns reports whether a fieldsV1 subtree names a field (not only its "." marker).
func owns(v any) bool {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return true // a leaf
	}
	for k := range m {
		if k != "." {
			return true
		}
	}
	return false
}

// drop removes the subtree at path (field names) from fields.
func drop(fields map[string]any, path []string) {
	if len(path) == 0 {
		return
	}
	key := "f:" + path[0]
	if len(path) == 1 {
		delete(fields, key)
		return
	}
	if sub, ok := fields[key].(map[string]any); ok && len(sub) > 0 {
		drop(sub, path[1:])
		if len(sub) == 0 || !owns(sub) { // nothing of it left but its "." marker
			delete(fields, key)
		}
	}
}
