package nsrequest

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NeedsUpdate reports whether the stored object differs from what the operator wants in the parts
// the operator owns: its labels and annotations, and the type's content. Fields others add
// (other labels, defaulted fields) are left alone.
func NeedsUpdate(got, want client.Object) bool {
	if !subset(want.GetLabels(), got.GetLabels()) || !subset(want.GetAnnotations(), got.GetAnnotations()) {
		return true
	}
	switch w := want.(type) {
	case *rbacv1.RoleBinding:
		g := got.(*rbacv1.RoleBinding)
		return g.RoleRef != w.RoleRef || !equality.Semantic.DeepEqual(g.Subjects, w.Subjects)
	case *rbacv1.Role:
		return !equality.Semantic.DeepEqual(got.(*rbacv1.Role).Rules, w.Rules)
	case *corev1.ResourceQuota:
		return !specIncluded(&w.Spec, &got.(*corev1.ResourceQuota).Spec)
	case *corev1.LimitRange:
		return !specIncluded(&w.Spec, &got.(*corev1.LimitRange).Spec)
	case *networkingv1.NetworkPolicy:
		return !specIncluded(&w.Spec, &got.(*networkingv1.NetworkPolicy).Spec)
	}
	return false
}

// specIncluded reports whether every field set in want has the same value in got. The API server
// fills in defaults (a LimitRange's defaultRequest, a NetworkPolicy's policyTypes and protocols),
// which must not read as drift, or every reconcile would write. want and got are pointers to specs.
func specIncluded(want, got any) bool {
	w, err1 := runtime.DefaultUnstructuredConverter.ToUnstructured(want)
	g, err2 := runtime.DefaultUnstructuredConverter.ToUnstructured(got)
	if err1 != nil || err2 != nil {
		return false
	}
	return included(w, g)
}

func included(want, got any) bool {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range w {
			if !included(v, g[k]) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !included(w[i], g[i]) {
				return false
			}
		}
		return true
	default:
		return equality.Semantic.DeepEqual(want, got)
	}
}

// ApplyTo returns a copy of got carrying want's labels, annotations and content.
func ApplyTo(got, want client.Object) client.Object {
	out := got.DeepCopyObject().(client.Object)
	out.SetLabels(merge(out.GetLabels(), want.GetLabels()))
	out.SetAnnotations(merge(out.GetAnnotations(), want.GetAnnotations()))
	switch w := want.(type) {
	case *rbacv1.RoleBinding:
		o := out.(*rbacv1.RoleBinding)
		o.RoleRef, o.Subjects = w.RoleRef, w.Subjects
	case *rbacv1.Role:
		out.(*rbacv1.Role).Rules = w.Rules
	case *corev1.ResourceQuota:
		out.(*corev1.ResourceQuota).Spec = w.Spec
	case *corev1.LimitRange:
		out.(*corev1.LimitRange).Spec = w.Spec
	case *networkingv1.NetworkPolicy:
		out.(*networkingv1.NetworkPolicy).Spec = w.Spec
	}
	return out
}

func subset(small, big map[string]string) bool {
	for k, v := range small {
		if w, ok := big[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func merge(dst, src map[string]string) map[string]string {
	if dst == nil && len(src) > 0 {
		dst = map[string]string{}
	}
	maps.Copy(dst, src)
	return dst
}
