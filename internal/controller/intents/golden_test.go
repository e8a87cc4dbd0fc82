package intents

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// compareObjects says how got differs from want: objects missing, unexpected, or different (the
// paths and both values); "" when they are the same.
func compareObjects(want, got map[string]map[string]any) string {
	var msgs []string
	for _, k := range sortedKeys(want) {
		g, ok := got[k]
		if !ok {
			msgs = append(msgs, "missing "+k)
			continue
		}
		for _, d := range diffValues(want[k], g, "") {
			msgs = append(msgs, k+": "+d)
		}
	}
	for _, k := range sortedKeys(got) {
		if _, ok := want[k]; !ok {
			msgs = append(msgs, "unexpected "+k)
		}
	}
	return strings.Join(msgs, "\n")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// diffValues lists the paths where got differs from want, with both values.
func diffValues(want, got any, path string) []string {
	wm, wok := want.(map[string]any)
	gm, gok := got.(map[string]any)
	if wok && gok {
		var out []string
		for _, k := range sortedKeys(wm) {
			out = append(out, diffValues(wm[k], gm[k], path+"."+k)...)
		}
		for _, k := range sortedKeys(gm) {
			if _, ok := wm[k]; !ok {
				out = append(out, diffValues(nil, gm[k], path+"."+k)...)
			}
		}
		return out
	}
	wl, wok := want.([]any)
	gl, gok := got.([]any)
	if wok && gok && len(wl) == len(gl) {
		var out []string
		for i := range wl {
			out = append(out, diffValues(wl[i], gl[i], fmt.Sprintf("%s[%d]", path, i))...)
		}
		return out
	}
	if reflect.DeepEqual(normalizeNumber(want), normalizeNumber(got)) {
		return nil
	}
	return []string{fmt.Sprintf("%s: want %s, got %s", path, oneLine(want), oneLine(got))}
}

func normalizeNumber(v any) any {
	switch n := v.(type) {
	case int64:
		return float64(n)
	case int:
		return float64(n)
	}
	return v
}

func oneLine(v any) string {
	if v == nil {
		return "nothing"
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", " | ")
}

// removeNimbusObjects deletes what a manifest made and everything generated from it (envtest has
// no garbage collector), and waits until none is left: bindings first, so nothing is generated again.
func (f *fixture) removeNimbusObjects(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	kinds := append(slices.Clone(userKinds), nimbusKinds...)
	eventually(t, "the example's objects removed", func() (bool, string) {
		var left []string
		for _, gvk := range kinds {
			for _, o := range f.listAll(t, gvk) {
				left = append(left, gvk.Kind+" "+client.ObjectKeyFromObject(&o).String())
				if err := f.c.Delete(ctx, &o); err != nil && !apierrors.IsNotFound(err) {
					return false, err.Error()
				}
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
}

// waitSettled waits until every binding and (Cluster)NimbusPolicy is Ready or stalled (for
// -update, which records what is there once the controller is done).
func (f *fixture) waitSettled(t *testing.T) {
	t.Helper()
	kinds := append(slices.Clone(userKinds[1:]), nimbusKinds[:2]...)
	eventually(t, "every binding and policy settled", func() (bool, string) {
		for _, gvk := range kinds {
			for _, o := range f.listAll(t, gvk) {
				conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
				observed, _, _ := unstructured.NestedInt64(o.Object, "status", "observedGeneration")
				var cs []metav1.Condition
				for _, c := range conds {
					m, _ := c.(map[string]any)
					cs = append(cs, metav1.Condition{Type: fmt.Sprint(m["type"]), Status: metav1.ConditionStatus(fmt.Sprint(m["status"]))})
				}
				settled := meta.IsStatusConditionTrue(cs, "Ready") || meta.IsStatusConditionTrue(cs, "Stalled")
				if !settled || observed != o.GetGeneration() {
					return false, gvk.Kind + " " + o.GetName()
				}
			}
		}
		return true, ""
	})
}

// writeGolden writes what the controller generated as the golden file, keeping the comments that
// led each object's document.
func (f *fixture) writeGolden(t *testing.T, path string) {
	t.Helper()
	comments := map[string][]string{}
	if b, err := os.ReadFile(path); err == nil {
		for _, doc := range splitYAML(b) {
			m := map[string]any{}
			if yaml.Unmarshal([]byte(doc.body), &m) == nil && len(m) > 0 {
				comments[objectKey(&unstructured.Unstructured{Object: m})] = doc.comments
			}
		}
	}
	got := f.generatedObjects(t)
	var buf bytes.Buffer
	for i, k := range sortedKeys(got) {
		if i > 0 {
			buf.WriteString("---\n")
		}
		for _, c := range comments[k] {
			buf.WriteString(c + "\n")
		}
		obj := &unstructured.Unstructured{Object: got[k]}
		if refs := obj.GetOwnerReferences(); len(refs) > 0 {
			obj.Object = replaceStrings(obj.Object, string(refs[0].UID), ownerUID).(map[string]any)
			owners, _, _ := unstructured.NestedSlice(obj.Object, "metadata", "ownerReferences")
			for _, o := range owners {
				delete(o.(map[string]any), "uid")
			}
			must(t, unstructured.SetNestedSlice(obj.Object, owners, "metadata", "ownerReferences"))
		}
		b, err := yaml.Marshal(obj.Object)
		must(t, err)
		buf.Write(b)
	}
	must(t, os.WriteFile(path, buf.Bytes(), 0o644))
}
