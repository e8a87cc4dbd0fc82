package controllers

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func controllers() []Controller {
	return []Controller{
		{Name: "a"},
		{Name: "b", Configured: func() error { return errors.New("--b-endpoint is required") }},
		{Name: "c"},
	}
}

func TestSelect(t *testing.T) {
	cases := []struct {
		flag         string
		wantEnabled  string
		wantDisabled string
		wantErr      string
	}{
		{flag: "", wantEnabled: "a,c", wantDisabled: "b"},
		{flag: "c", wantEnabled: "c"},
		{flag: " a , c ", wantEnabled: "a,c"},
		{flag: "a,b", wantErr: "--b-endpoint is required"},
		{flag: "nonsense", wantErr: `unknown controller "nonsense"; valid controllers are: a, b, c`},
	}
	for _, tc := range cases {
		t.Run(tc.flag, func(t *testing.T) {
			sel, err := Select(tc.flag, controllers())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(Names(sel.Enabled), ","); got != tc.wantEnabled {
				t.Errorf("enabled %q, want %q", got, tc.wantEnabled)
			}
			var disabled []string
			for n := range sel.Disabled {
				disabled = append(disabled, n)
			}
			if got := strings.Join(disabled, ","); got != tc.wantDisabled {
				t.Errorf("disabled %q, want %q", got, tc.wantDisabled)
			}
		})
	}
}

func TestCacheOptionsMergesTwoRestrictionsOfOneKind(t *testing.T) {
	managed := labels.SelectorFromSet(labels.Set{"managed-by": "a"})
	other := labels.SelectorFromSet(labels.Set{"managed-by": "b"})
	only := func(m map[client.Object]cache.ByObject) func() map[client.Object]cache.ByObject {
		return func() map[client.Object]cache.ByObject { return m }
	}
	a := Controller{Name: "a", CacheByObject: only(map[client.Object]cache.ByObject{
		&corev1.Secret{}:    {Namespaces: map[string]cache.Config{"requests": {}}, Label: managed},
		&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{"requests": {}}},
		&corev1.Namespace{}: {Label: managed},
	})}
	b := Controller{Name: "b", CacheByObject: only(map[client.Object]cache.ByObject{
		&corev1.Secret{}:    {Namespaces: map[string]cache.Config{"mirrors": {}}, Label: managed},
		&corev1.ConfigMap{}: {},
		&corev1.Namespace{}: {Label: other},
	})}

	alone, notes := CacheOptions([]Controller{a, {Name: "c"}})
	if len(notes) != 0 || len(alone) != 3 {
		t.Fatalf("one controller's restrictions: %v, notes %v", alone, notes)
	}
	merged, notes := CacheOptions([]Controller{a, b})
	got := map[string]cache.ByObject{}
	for obj, by := range merged {
		got[fmt.Sprintf("%T", obj)] = by
	}
	if len(got) != 3 {
		t.Fatalf("merged %d kinds, want 3", len(got))
	}
	if s := got["*v1.Secret"]; len(s.Namespaces) != 2 || s.Label == nil || s.Label.String() != managed.String() {
		t.Errorf("Secrets: %+v, want both namespaces with the shared label", s)
	}
	if c := got["*v1.ConfigMap"]; c.Namespaces != nil {
		t.Errorf("ConfigMaps: %+v, want every namespace (b watches them all)", c)
	}
	if n := got["*v1.Namespace"]; n.Label != nil {
		t.Errorf("Namespaces: %+v, want no label selector (two different ones cannot be one watch)", n)
	}
	want := []string{"*v1.ConfigMap: every namespace is cached", "*v1.Namespace: no label selector"}
	for _, w := range want {
		if !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "controllers a, b") && strings.Contains(n, w) }) {
			t.Errorf("no note %q in %v", w, notes)
		}
	}
	if len(notes) != len(want) {
		t.Errorf("notes %v, want only %v", notes, want)
	}
}

func TestNewInformerDropsTheNamespaceIndexOnlyWhereEveryControllerAgrees(t *testing.T) {
	kinds := func(objs ...client.Object) func() map[client.Object]cache.ByObject {
		return func() map[client.Object]cache.ByObject {
			m := map[client.Object]cache.ByObject{}
			for _, o := range objs {
				m[o] = cache.ByObject{}
			}
			return m
		}
	}
	a := Controller{Name: "a", CacheByObject: kinds(&corev1.Secret{}, &corev1.ConfigMap{}),
		NoNamespaceIndex: []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}}}
	b := Controller{Name: "b", CacheByObject: kinds(&corev1.ConfigMap{})}
	newInformer := NewInformer([]Controller{a, b})
	indexed := func(obj runtime.Object) bool {
		indexers := toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc, "other": toolscache.MetaNamespaceIndexFunc}
		got := newInformer(nil, obj, 0, indexers).GetIndexer().GetIndexers()
		if _, ok := got["other"]; !ok || len(indexers) != 2 {
			t.Errorf("%T: other indexes lost, or the caller's indexers changed: %v", obj, got)
		}
		_, ok := got[toolscache.NamespaceIndex]
		return ok
	}
	if indexed(&corev1.Secret{}) {
		t.Error("Secrets keep the namespace index, though only a caches them and marks them")
	}
	if !indexed(&corev1.ConfigMap{}) {
		t.Error("ConfigMaps lost the namespace index, though b caches them without marking them")
	}
	if !indexed(&corev1.Namespace{}) {
		t.Error("Namespaces lost the namespace index, though no controller marks them")
	}
}
