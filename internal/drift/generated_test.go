package drift

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func policy(spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kyverno.io/v1", "kind": "Policy",
		"metadata": map[string]any{"name": "p", "namespace": "shop", "labels": map[string]any{"a": "b"}},
		"spec":     spec,
	}}
	u.SetOwnerReferences([]metav1.OwnerReference{{Kind: "NimbusPolicy", Name: "web", UID: "np-uid", Controller: new(true)}})
	return u
}

func entry(manager, subresource, fields string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: subresource,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}
}

// stored is the object as the API server keeps it after our write: stamped, defaults filled in
// (owned by us: a default set while our write is stored is ours), plus entries.
func stored(t *testing.T, entries ...metav1.ManagedFieldsEntry) (desired, live *unstructured.Unstructured) {
	t.Helper()
	desired = policy(map[string]any{"rules": []any{map[string]any{"name": "r", "validate": map[string]any{"failureAction": "Enforce"}}}})
	if err := Stamp(desired); err != nil {
		t.Fatal(err)
	}
	live = desired.DeepCopy()
	spec := live.Object["spec"].(map[string]any)
	spec["admission"], spec["background"] = true, true
	spec["rules"].([]any)[0].(map[string]any)["validate"].(map[string]any)["allowExistingViolations"] = true
	live.SetAnnotations(map[string]string{HashAnnotation: desired.GetAnnotations()[HashAnnotation], "someone's": "note"})
	live.SetManagedFields(append([]metav1.ManagedFieldsEntry{entry(FieldManager, "", `{"f:spec":{"f:rules":{},"f:admission":{}}}`)}, entries...))
	return desired, live
}

func TestCurrent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []metav1.ManagedFieldsEntry
		others  []Path
		edit    func(live *unstructured.Unstructured)
		want    bool
	}{
		{name: "as written, with the server's defaults", want: true},
		{name: "the engine's status writes", entries: []metav1.ManagedFieldsEntry{entry("kyverno", "status", `{"f:status":{"f:conditions":{}}}`)}, want: true},
		{name: "someone's metadata (a label, the garbage collector)", entries: []metav1.ManagedFieldsEntry{entry("kubectl-label", "", `{"f:metadata":{"f:labels":{"f:x":{}}}}`)}, want: true},
		{name: "an edit of the spec", entries: []metav1.ManagedFieldsEntry{entry("kubectl-edit", "", `{"f:spec":{"f:rules":{}}}`)}},
		{name: "a field added (admission off)", entries: []metav1.ManagedFieldsEntry{entry("kubectl-patch", "", `{"f:spec":{"f:admission":{}}}`)}},
		{name: "a top-level field of a ConfigMap", entries: []metav1.ManagedFieldsEntry{entry("kubectl-edit", "", `{"f:data":{"f:x":{}}}`)}},
		{name: "a path others may write", entries: []metav1.ManagedFieldsEntry{entry("kubectl-rollout", "", `{"f:spec":{"f:template":{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/restartedAt":{}}}}}}`)},
			others: []Path{"spec.template.metadata.annotations"}, want: true},
		{name: "beside a path others may write", entries: []metav1.ManagedFieldsEntry{entry("kubectl-edit", "", `{"f:spec":{"f:template":{"f:metadata":{"f:annotations":{}},"f:spec":{"f:x":{}}}}}`)},
			others: []Path{"spec.template.metadata.annotations"}},
		{name: "a label of ours removed", edit: func(l *unstructured.Unstructured) { l.SetLabels(nil) }},
		{name: "the hash of an older want", edit: func(l *unstructured.Unstructured) {
			l.SetAnnotations(map[string]string{HashAnnotation: "older"})
		}},
		{name: "another controller", edit: func(l *unstructured.Unstructured) {
			l.SetOwnerReferences([]metav1.OwnerReference{{Kind: "NimbusPolicy", Name: "web", UID: "other", Controller: new(true)}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			desired, live := stored(t, tc.entries...)
			if tc.edit != nil {
				tc.edit(live)
			}
			if got := Current(desired, live, tc.others...); got != tc.want {
				t.Errorf("Current = %v, want %v", got, tc.want)
			}
			// The cache keeps only what the rule needs, and the rule reads it the same way.
			live.SetManagedFields(Summary(live.GetManagedFields()))
			if got := Current(desired, live, tc.others...); got != tc.want {
				t.Errorf("Current on the cache's summary = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHashSaysWhatTheWantSays(t *testing.T) {
	base := policy(map[string]any{"background": true, "rules": []any{"x"}})
	h := func(u *unstructured.Unstructured) string {
		s, err := Hash(u)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	same := base.DeepCopy()
	same.SetResourceVersion("42")
	same.SetAnnotations(map[string]string{HashAnnotation: "anything"})
	same.Object["status"] = map[string]any{"ready": true}
	if h(base) != h(same) {
		t.Error("the hash depends on the resourceVersion, the hash annotation or the status")
	}
	for name, edit := range map[string]func(u *unstructured.Unstructured){
		"a field dropped": func(u *unstructured.Unstructured) { delete(u.Object["spec"].(map[string]any), "background") },
		"a label":         func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"a": "c"}) },
		"an annotation":   func(u *unstructured.Unstructured) { u.SetAnnotations(map[string]string{"x": "y"}) },
		"the controller": func(u *unstructured.Unstructured) {
			u.SetOwnerReferences([]metav1.OwnerReference{{Kind: "NimbusPolicy", Name: "web", UID: "other", Controller: new(true)}})
		},
	} {
		u := base.DeepCopy()
		edit(u)
		if h(u) == h(base) {
			t.Errorf("%s: same hash", name)
		}
	}
}

// A typed object is hashed from its own JSON (no conversion): the same rule, and the object
// itself is left as it was.
func TestHashOfATypedObject(t *testing.T) {
	base := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "team-a", Labels: map[string]string{"a": "b"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{"token": []byte("t1"), "ca.crt": []byte("ca")},
	}
	h := func(s *corev1.Secret) string {
		t.Helper()
		before := s.DeepCopy()
		got, err := Hash(s)
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(before, s) {
			t.Fatal("Hash changed the object it hashed")
		}
		return got
	}
	same := base.DeepCopy()
	same.ResourceVersion, same.UID, same.Generation = "42", "uid", 3
	same.ManagedFields = []metav1.ManagedFieldsEntry{entry("kubectl-edit", "", `{"f:data":{}}`)}
	same.Annotations = map[string]string{HashAnnotation: "anything"}
	if h(base) != h(same) {
		t.Error("the hash depends on the resourceVersion, the UID, managedFields or the hash annotation")
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}}
	reported := pod.DeepCopy()
	reported.Status.Phase = corev1.PodRunning
	if hp, hr := mustHash(t, pod), mustHash(t, reported); hp != hr {
		t.Error("the hash depends on the status")
	}
	for name, edit := range map[string]func(s *corev1.Secret){
		"a value":       func(s *corev1.Secret) { s.Data["token"] = []byte("t2") },
		"a key dropped": func(s *corev1.Secret) { delete(s.Data, "ca.crt") },
		"the type":      func(s *corev1.Secret) { s.Type = corev1.SecretTypeDockerConfigJson },
		"immutable set": func(s *corev1.Secret) { s.Immutable = new(false) },
		"a label":       func(s *corev1.Secret) { s.Labels = map[string]string{"a": "c"} },
		"an annotation": func(s *corev1.Secret) { s.Annotations = map[string]string{"x": "y"} },
		"the controller": func(s *corev1.Secret) {
			s.OwnerReferences = []metav1.OwnerReference{{Kind: "Namespace", Name: "team-a", UID: "u", Controller: new(true)}}
		},
	} {
		s := base.DeepCopy()
		edit(s)
		if h(s) == h(base) {
			t.Errorf("%s: same hash", name)
		}
	}
	// Map order never matters: the same want built twice hashes alike.
	again := base.DeepCopy()
	again.Data = map[string][]byte{"ca.crt": []byte("ca"), "token": []byte("t1")}
	if h(again) != h(base) {
		t.Error("the same data hashes two ways")
	}
}

func mustHash(t *testing.T, o Object) string {
	t.Helper()
	s, err := Hash(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Objects made alike in many namespaces carry one hash (the cache keeps one copy of their
// annotations), and in one namespace the hash still tells every two wants apart, those that differ
// only where one says the namespace's name included.
func TestHashIsRelativeToTheNamespace(t *testing.T) {
	in := func(ns, subject string) string {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
			"metadata": map[string]any{"name": "admin", "namespace": ns, "labels": map[string]any{"request": "requests." + ns}},
			"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": "admin", "namespace": subject}},
		}}
		s, err := Hash(u)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if in("team-a", "team-a") != in("team-b", "team-b") {
		t.Error("objects made alike in two namespaces have two hashes")
	}
	for _, other := range []string{"team-b", "team-a-x", "", "\u0000", "1"} {
		if in("team-a", "team-a") == in("team-a", other) {
			t.Errorf("a subject in %q hashes like one in the object's own namespace", other)
		}
	}
	if in("1", "1") == in("1", "2") || in("1", "2") == in("1", "12") {
		t.Error("a namespace named like a number makes two wants hash alike")
	}
}

func TestSummaryKeepsOnlyEdits(t *testing.T) {
	entries := []metav1.ManagedFieldsEntry{
		entry(FieldManager, "", `{"f:spec":{}}`),
		entry("kyverno", "status", `{"f:status":{}}`),
		entry("kubectl-label", "", `{"f:metadata":{"f:labels":{}}}`),
		entry("kubectl-edit", "", `{"f:metadata":{"f:labels":{}},"f:spec":{"f:x":{}}}`),
	}
	got := Summary(entries)
	if len(got) != 1 || got[0].Manager != "kubectl-edit" || got[0].FieldsV1.GetRawString() != `{"f:spec":{"f:x":{}}}` {
		t.Errorf("Summary = %+v", got)
	}
	if again := Summary(got); len(again) != 1 || again[0].FieldsV1.GetRawString() != got[0].FieldsV1.GetRawString() {
		t.Errorf("Summary of a summary = %+v", again)
	}
	if got := Edits([]metav1.ManagedFieldsEntry{entry("x", "", `{`)}); !slices.Equal(got, []string{"x"}) {
		t.Errorf("an unreadable entry: Edits = %v, want it counted", got)
	}
	if !slices.Equal(Edits(entries), []string{"kubectl-edit"}) {
		t.Errorf("Edits = %v", Edits(entries))
	}
}

// TestTakeEdits: the content fields others own move to FieldManager's entry; their metadata and the
// paths others may write stay theirs; status entries are untouched; the result has no edits.
func TestTakeEdits(t *testing.T) {
	entries := []metav1.ManagedFieldsEntry{
		entry(FieldManager, "", `{"f:metadata":{"f:annotations":{"f:quartermaster.dev/generated":{}}},"f:spec":{"f:replicas":{}}}`),
		entry("kubectl-edit", "", `{"f:metadata":{"f:labels":{"f:team":{}}},"f:spec":{"f:template":{"f:metadata":{"f:annotations":{"f:kubectl.kubernetes.io/restartedAt":{}}}},"f:selector":{}}}`),
		entry("creator", "", `{"f:roleRef":{}}`),
		entry("kube-controller-manager", "status", `{"f:status":{"f:replicas":{}}}`),
	}
	others := []Path{"spec.template.metadata.annotations"}
	got := TakeEdits(entries, others...)
	if e := Edits(got, others...); len(e) != 0 {
		t.Fatalf("after TakeEdits, edits by %v", e)
	}
	byManager := map[string]string{}
	for _, e := range got {
		byManager[e.Manager+"/"+e.Subresource] = e.FieldsV1.String()
	}
	want := map[string]string{
		FieldManager + "/":               `{"f:metadata":{"f:annotations":{"f:quartermaster.dev/generated":{}}},"f:roleRef":{},"f:spec":{"f:replicas":{},"f:selector":{}}}`,
		"kubectl-edit/":                  `{"f:metadata":{"f:labels":{"f:team":{}}},"f:spec":{"f:template":{"f:metadata":{"f:annotations":{"f:kubectl.kubernetes.io/restartedAt":{}}}}}}`,
		"kube-controller-manager/status": `{"f:status":{"f:replicas":{}}}`,
	}
	if len(byManager) != len(want) {
		t.Errorf("entries %v, want %v", byManager, want)
	}
	for k, v := range want {
		if byManager[k] != v {
			t.Errorf("%s: %s\nwant %s", k, byManager[k], v)
		}
	}
}
