package namespaces

import (
	"reflect"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
)

// What the cache holds of the objects made in requested namespaces costs memory per namespace, so
// what is the same in many of them is stored once: the labels and annotations (the same on every
// object made for one request), the specs of the defaults (every namespace gets the same
// ResourceQuota, LimitRange and NetworkPolicy), and the strings of role references and subjects.
// Each transform also does what the manager's default transform does (cachemeta). Measured by
// TestCacheCostPerServedRequest.

// The defaults' specs, shared by every namespace that has the same.
var (
	quotaSpecs         = cachemeta.NewShared(specEqual[corev1.ResourceQuotaSpec])
	limitRangeSpecs    = cachemeta.NewShared(specEqual[corev1.LimitRangeSpec])
	networkPolicySpecs = cachemeta.NewShared(specEqual[networkingv1.NetworkPolicySpec])
)

// specEqual is exact equality: a shared spec must read the same as the one it replaces, byte for
// byte (semantic equality would let "1000m" stand for "1").
func specEqual[S any](a, b S) bool { return reflect.DeepEqual(a, b) }

// marshaler is a spec's protobuf encoding, the content its hash is taken of.
type marshaler interface{ Marshal() ([]byte, error) }

func specHash(spec marshaler) (uint64, bool) {
	b, err := spec.Marshal()
	return cachemeta.HashBytes(b), err == nil
}

// shareDefaults is the cache's transform of ResourceQuotas, LimitRanges and NetworkPolicies. A
// ResourceQuota is kept without its status: the quota controller rewrites the usage at every pod
// the tenant creates or deletes, and the controller reads only the spec.
func shareDefaults(obj any) (any, error) {
	obj, err := cachemeta.Transform(obj)
	if err != nil {
		return obj, err
	}
	if meta := objectMeta(obj); meta != nil {
		cachemeta.ShareMaps(meta)
	}
	switch o := obj.(type) {
	case *corev1.ResourceQuota:
		o.Status = corev1.ResourceQuotaStatus{}
		if h, ok := specHash(&o.Spec); ok {
			o.Spec = quotaSpecs.Share(&o.ObjectMeta, h, o.Spec)
		}
	case *corev1.LimitRange:
		if h, ok := specHash(&o.Spec); ok {
			o.Spec = limitRangeSpecs.Share(&o.ObjectMeta, h, o.Spec)
		}
	case *networkingv1.NetworkPolicy:
		if h, ok := specHash(&o.Spec); ok {
			o.Spec = networkPolicySpecs.Share(&o.ObjectMeta, h, o.Spec)
		}
	}
	return obj, nil
}

// internContent is the cache's transform of the Namespaces and the other kinds made in them: the
// strings of role references and subjects, the same in every namespace (or the namespace's own
// name, stored once already), are stored once. A Namespace's labels and annotations are its own
// (its name, the request's UID) and are not worth sharing.
func internContent(obj any) (any, error) {
	obj, err := cachemeta.Transform(obj)
	if err != nil {
		return obj, err
	}
	if _, ns := obj.(*corev1.Namespace); !ns {
		if meta := objectMeta(obj); meta != nil {
			cachemeta.ShareMaps(meta)
		}
	}
	switch o := obj.(type) {
	case *rbacv1.RoleBinding:
		for _, s := range []*string{&o.Name, &o.RoleRef.APIGroup, &o.RoleRef.Kind, &o.RoleRef.Name} {
			cachemeta.InternAt(s)
		}
		for i := range o.Subjects {
			s := &o.Subjects[i]
			for _, f := range []*string{&s.APIGroup, &s.Kind, &s.Name, &s.Namespace} {
				cachemeta.InternAt(f)
			}
		}
	case *rbacv1.Role:
		cachemeta.InternAt(&o.Name)
		for i := range o.Rules {
			r := &o.Rules[i]
			for _, l := range [][]string{r.APIGroups, r.Resources, r.ResourceNames, r.Verbs, r.NonResourceURLs} {
				for j := range l {
					cachemeta.InternAt(&l[j])
				}
			}
		}
	case *corev1.ServiceAccount:
		cachemeta.InternAt(&o.Name)
	}
	return obj, nil
}

// objectMeta is the metadata of a typed object, or nil (a tombstone).
func objectMeta(obj any) *metav1.ObjectMeta {
	if a, ok := obj.(metav1.ObjectMetaAccessor); ok {
		m, _ := a.GetObjectMeta().(*metav1.ObjectMeta)
		return m
	}
	return nil
}
