// Package v1alpha1 is the registry.quartermaster.dev/v1alpha1 API: RegistryMirror, an in-cluster
// pull-through cache of one upstream registry that every node's containerd uses.
// +kubebuilder:object:generate=true
// +groupName=registry.quartermaster.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "registry.quartermaster.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the API's kinds with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &RegistryMirror{}, &RegistryMirrorList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
