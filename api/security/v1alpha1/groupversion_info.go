// Package v1alpha1 is the security.quartermaster.dev/v1alpha1 API: SecurityIntentException, an
// exemption of some workloads from a SecurityIntent's policies, with an owner, a reason and an
// expiry that the intents controller enforces (the engine's own exception is deleted at expiry).
// Nimbus's API (intent.security.nimbus.com) stays untouched.
// +kubebuilder:object:generate=true
// +groupName=security.quartermaster.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "security.quartermaster.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the API's kinds with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &SecurityIntentException{}, &SecurityIntentExceptionList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
