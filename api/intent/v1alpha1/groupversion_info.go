// Package v1alpha1 is the intent.security.nimbus.com/v1alpha1 API, compatible with the Nimbus
// project's (github.com/5GSEC/nimbus) field for field: SecurityIntent says what must not happen,
// SecurityIntentBinding and ClusterSecurityIntentBinding apply intents to workloads, and
// NimbusPolicy and ClusterNimbusPolicy are what the bindings resolve to, from which the engines'
// policies are generated. Quartermaster adds kstatus conditions and admission-time validation of
// what Nimbus checked only in its reconcilers.
// +kubebuilder:object:generate=true
// +groupName=intent.security.nimbus.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "intent.security.nimbus.com", Version: "v1alpha1"}

	// SchemeBuilder registers the API's kinds with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&SecurityIntent{}, &SecurityIntentList{},
		&SecurityIntentBinding{}, &SecurityIntentBindingList{},
		&ClusterSecurityIntentBinding{}, &ClusterSecurityIntentBindingList{},
		&NimbusPolicy{}, &NimbusPolicyList{},
		&ClusterNimbusPolicy{}, &ClusterNimbusPolicyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// StatusCreated is the status string Nimbus shows for every object it has processed.
const StatusCreated = "Created"

// Actions an intent may take.
const (
	ActionBlock = "Block"
	ActionAudit = "Audit"
)
