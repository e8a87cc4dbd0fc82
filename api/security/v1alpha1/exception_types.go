package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SecurityIntentExceptionSpec exempts workloads from one SecurityIntent until an expiry.
// What the API server cannot check (an expiry in the past or beyond the platform's maximum,
// --intents-exception-max-ttl; an intent that does not exist; namespaces other than the
// exception's own from a namespace the platform has not named; every workload of every
// namespace) is refused by the controller before it writes anything: the exception is Stalled,
// the reason naming the check.
// +kubebuilder:validation:XValidation:rule="!has(self.workloads.namespaces) || !('*' in self.workloads.namespaces) || size(self.workloads.namespaces) == 1",message="\"*\" in workloads.namespaces must be its only entry"
type SecurityIntentExceptionSpec struct {
	// Intent names the SecurityIntent whose policies the workloads are exempted from.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Intent string `json:"intent"`

	// Workloads are the workloads exempted.
	// +required
	Workloads ExemptedWorkloads `json:"workloads"`

	// Owner is who answers for the exception (a team, a person, an address): shown in the intent's
	// status and in the Events at expiry.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Owner string `json:"owner"`

	// Reason says why the workloads cannot comply yet (a ticket, a vendor's release).
	// +kubebuilder:validation:MinLength=10
	// +kubebuilder:validation:MaxLength=1024
	// +required
	Reason string `json:"reason"`

	// Expires is when the exemption ends: the engine's exception is deleted then, whatever the
	// engine itself does with expiry. Required; at most --intents-exception-max-ttl after the
	// exception's creation.
	// +kubebuilder:validation:Format=date-time
	// +required
	Expires metav1.Time `json:"expires"`
}

// ExemptedWorkloads picks workloads by namespace and labels.
type ExemptedWorkloads struct {
	// Selector picks the workloads by their labels; {} picks every workload of the namespaces.
	// +required
	Selector metav1.LabelSelector `json:"selector"`

	// Namespaces the workloads are in: the exception's own when empty. Another namespace, or "*"
	// for every namespace, only for an exception in a namespace the platform names
	// (--intents-exception-admin-namespaces).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$`
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
}

// SecurityIntentExceptionStatus says whether the exemption is in force, where, and until when.
type SecurityIntentExceptionStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (Kyverno's PolicyException is stored where Kyverno reads them; reason
	// ExpiresSoon in the last --intents-exception-expiry-warning), Reconciling, Stalled (refused
	// with the failed check, or Expired).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// PolicyException is the Kyverno PolicyException that carries the exemption (namespace/name),
	// while it exists.
	// +optional
	PolicyException string `json:"policyException,omitempty"`
	// Policies are the intent's Kyverno policies the workloads are exempted from (Kind/name, a
	// namespaced Policy as namespace/name).
	// +optional
	Policies []string `json:"policies,omitempty"`
	// Exempted is how many workloads Kyverno's reports say it skipped under the PolicyException
	// (Kyverno's own word that it honours it); absent while the reports cannot be read.
	// +optional
	Exempted *int32 `json:"exempted,omitempty"`
}

// SecurityIntentException exempts workloads from a SecurityIntent, with an owner, a reason and an
// enforced expiry.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sie
// +kubebuilder:printcolumn:name="Intent",type=string,JSONPath=`.spec.intent`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.spec.owner`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.spec.expires`
// +kubebuilder:printcolumn:name="Exempted",type=integer,JSONPath=`.status.exempted`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SecurityIntentException struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SecurityIntentExceptionSpec   `json:"spec,omitempty"`
	Status SecurityIntentExceptionStatus `json:"status,omitempty"`
}

// SecurityIntentExceptionList is a list of SecurityIntentExceptions.
// +kubebuilder:object:root=true
type SecurityIntentExceptionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SecurityIntentException `json:"items"`
}
