// Package v1alpha1 is the namespaces.quartermaster.dev/v1alpha1 API: TrustedIssuer, an OIDC issuer
// of CI job identity tokens (GitHub Actions, GitLab CI, any issuer with a discovery document) whose
// tokens the namespaces controller exchanges for the namespace their claims allow.
// +kubebuilder:object:generate=true
// +groupName=namespaces.quartermaster.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "namespaces.quartermaster.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the API's kinds with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &TrustedIssuer{}, &TrustedIssuerList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
