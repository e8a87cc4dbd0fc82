package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MatchIntent names a SecurityIntent.
type MatchIntent struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// LabelSelector selects by labels (matchLabels only, as in Nimbus).
type LabelSelector struct {
	// +optional
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// MatchWorkloads selects the workloads of a namespaced binding.
type MatchWorkloads struct {
	// +optional
	WorkloadSelector LabelSelector `json:"workloadSelector,omitempty"`
}

// NamespaceSelector picks namespaces by name: matchNames (["*"] for all), or excludeNames (all
// but these), or ["*"] with excludeNames.
// +kubebuilder:validation:XValidation:rule="(has(self.matchNames) && size(self.matchNames) > 0) || (has(self.excludeNames) && size(self.excludeNames) > 0)",message="set nsSelector.matchNames (names, or [\"*\"] for every namespace) or nsSelector.excludeNames"
// +kubebuilder:validation:XValidation:rule="!has(self.matchNames) || !self.matchNames.exists(n, n == '*') || size(self.matchNames) == 1",message="\"*\" in nsSelector.matchNames must be its only entry"
// +kubebuilder:validation:XValidation:rule="!has(self.matchNames) || !has(self.excludeNames) || size(self.excludeNames) == 0 || self.matchNames == ['*']",message="nsSelector.excludeNames can only be combined with matchNames: [\"*\"]; list the namespaces to match or those to exclude, not both"
type NamespaceSelector struct {
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=63
	// +optional
	MatchNames []string `json:"matchNames,omitempty"`
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=63
	// +optional
	ExcludeNames []string `json:"excludeNames,omitempty"`
}

// ClusterMatchWorkloads selects the namespaces and workloads of a cluster binding.
type ClusterMatchWorkloads struct {
	// +optional
	NodeSelector LabelSelector     `json:"nodeSelector,omitempty"`
	NsSelector   NamespaceSelector `json:"nsSelector"`
	// +optional
	WorkloadSelector LabelSelector `json:"workloadSelector,omitempty"`
}

// SecurityIntentBindingSpec binds intents to the workloads of its namespace.
// +kubebuilder:validation:XValidation:rule="(has(self.selector.workloadSelector) && has(self.selector.workloadSelector.matchLabels) && size(self.selector.workloadSelector.matchLabels) > 0) || (has(self.cel) && size(self.cel) > 0)",message="select the workloads with selector.workloadSelector.matchLabels or cel (Nimbus silently generates nothing without either)"
type SecurityIntentBindingSpec struct {
	// Intents names SecurityIntents, in the order their rules appear in the NimbusPolicy.
	// +kubebuilder:validation:MinItems=1
	Intents  []MatchIntent  `json:"intents"`
	Selector MatchWorkloads `json:"selector"`
	// CEL expressions over a workload's labels that add to selector.workloadSelector.matchLabels,
	// e.g. labels["app"] == "nginx". Each must require labels to have one value each (==, in a
	// list of one, joined by &&): the engines select workloads by labels.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	// +optional
	CEL []string `json:"cel,omitempty"`
}

// SecurityIntentBindingStatus is what the binding resolved to.
type SecurityIntentBindingStatus struct {
	Status string `json:"status"`
	// +optional
	LastUpdated          metav1.Time `json:"lastUpdated,omitempty"`
	NumberOfBoundIntents int32       `json:"numberOfBoundIntents"`
	// BoundIntents are the named intents that exist, in binding order.
	// +optional
	BoundIntents []string `json:"boundIntents,omitempty"`
	// NimbusPolicy is the name of the NimbusPolicy generated for the binding ("" when none).
	NimbusPolicy string `json:"nimbusPolicy"`

	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, Reconciling, Stalled.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Impact is what the engines' scans found against the binding's policies.
	// +optional
	Impact *Impact `json:"impact,omitempty"`
	// EnforcedIntents are the bound intents at the generation the binding last had in force: an
	// intent is Ready at a generation only when every binding naming it enforces that generation.
	// +optional
	EnforcedIntents []EnforcedIntent `json:"enforcedIntents,omitempty"`
}

// EnforcedIntent is an intent, by name, at the generation a binding enforces.
type EnforcedIntent struct {
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
}

// SecurityIntentBinding applies intents to the workloads of its namespace.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sib
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Intents",type=integer,JSONPath=`.status.numberOfBoundIntents`
// +kubebuilder:printcolumn:name="NimbusPolicy",type=string,JSONPath=`.status.nimbusPolicy`
// +kubebuilder:printcolumn:name="Violations",type=integer,JSONPath=`.status.impact.violations`
type SecurityIntentBinding struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SecurityIntentBindingSpec   `json:"spec,omitempty"`
	Status SecurityIntentBindingStatus `json:"status,omitempty"`
}

// SecurityIntentBindingList is a list of SecurityIntentBindings.
// +kubebuilder:object:root=true
type SecurityIntentBindingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SecurityIntentBinding `json:"items"`
}

// ClusterSecurityIntentBindingSpec binds intents to workloads of the namespaces it selects.
// +kubebuilder:validation:XValidation:rule="has(self.selector) && has(self.selector.nsSelector)",message="set selector.nsSelector.matchNames (names, or [\"*\"] for every namespace) or selector.nsSelector.excludeNames"
type ClusterSecurityIntentBindingSpec struct {
	// Intents names SecurityIntents, in the order their rules appear in the policies.
	// +kubebuilder:validation:MinItems=1
	Intents []MatchIntent `json:"intents"`
	// +optional
	Selector ClusterMatchWorkloads `json:"selector,omitempty"`
	// CEL is accepted for compatibility; Nimbus ignores it for cluster bindings, and so does
	// Quartermaster.
	// +optional
	CEL []string `json:"cel,omitempty"`
}

// ClusterSecurityIntentBindingStatus is what the cluster binding resolved to.
type ClusterSecurityIntentBindingStatus struct {
	Status string `json:"status"`
	// +optional
	LastUpdated          metav1.Time `json:"lastUpdated,omitempty"`
	NumberOfBoundIntents int32       `json:"numberOfBoundIntents"`
	// +optional
	BoundIntents []string `json:"boundIntents,omitempty"`
	// ClusterNimbusPolicy is the name of the generated ClusterNimbusPolicy ("" when none).
	ClusterNimbusPolicy    string `json:"clusterNimbusPolicy"`
	NumberOfNimbusPolicies int32  `json:"numberOfNimbusPolicies"`
	// NimbusPolicyNamespaces lists, sorted, the namespaces holding a generated NimbusPolicy.
	// +optional
	NimbusPolicyNamespaces []string `json:"nimbusPolicyNamespaces,omitempty"`

	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, Reconciling, Stalled.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Impact is what the engines' scans found against the binding's policies.
	// +optional
	Impact *Impact `json:"impact,omitempty"`
	// EnforcedIntents are the bound intents at the generation the binding last had in force: an
	// intent is Ready at a generation only when every binding naming it enforces that generation.
	// +optional
	EnforcedIntents []EnforcedIntent `json:"enforcedIntents,omitempty"`
}

// ClusterSecurityIntentBinding applies intents to workloads across namespaces.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=csib
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Intents",type=integer,JSONPath=`.status.numberOfBoundIntents`
// +kubebuilder:printcolumn:name="NimbusPolicies",type=integer,JSONPath=`.status.numberOfNimbusPolicies`
// +kubebuilder:printcolumn:name="ClusterNimbusPolicy",type=string,JSONPath=`.status.clusterNimbusPolicy`
// +kubebuilder:printcolumn:name="Violations",type=integer,JSONPath=`.status.impact.violations`
type ClusterSecurityIntentBinding struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterSecurityIntentBindingSpec   `json:"spec,omitempty"`
	Status ClusterSecurityIntentBindingStatus `json:"status,omitempty"`
}

// ClusterSecurityIntentBindingList is a list of ClusterSecurityIntentBindings.
// +kubebuilder:object:root=true
type ClusterSecurityIntentBindingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterSecurityIntentBinding `json:"items"`
}
