package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Rule is an intent's action and params as bound.
type Rule struct {
	RuleAction string `json:"action"`
	// +optional
	Params map[string]ParamValues `json:"params,omitempty"`
}

// NimbusRules is one bound intent.
type NimbusRules struct {
	ID string `json:"id"`
	// +optional
	Type string `json:"type,omitempty"`
	// +optional
	Description string `json:"description,omitempty"`
	Rule        Rule   `json:"rule"`
}

// NimbusPolicySpec is the intents bound to the workloads of one namespace.
type NimbusPolicySpec struct {
	Selector    LabelSelector `json:"selector"`
	NimbusRules []NimbusRules `json:"rules"`
}

// NimbusPolicyStatus lists the engine policies generated from the policy.
type NimbusPolicyStatus struct {
	Status string `json:"status"`
	// +optional
	LastUpdated             metav1.Time `json:"lastUpdated,omitempty"`
	NumberOfAdapterPolicies int32       `json:"numberOfAdapterPolicies"`
	// Policies are the generated engine policies as Kind/name (KubeArmorPolicy/…,
	// NetworkPolicy/…, KyvernoPolicy/…), in rule order.
	// +optional
	Policies []string `json:"adapterPolicies,omitempty"`

	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, Reconciling, Stalled.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NimbusPolicy is what a binding resolves to in one namespace; engine policies are generated
// from it and owned by it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=np
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Policies",type=integer,JSONPath=`.status.numberOfAdapterPolicies`
type NimbusPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NimbusPolicySpec   `json:"spec,omitempty"`
	Status NimbusPolicyStatus `json:"status,omitempty"`
}

// NimbusPolicyList is a list of NimbusPolicies.
// +kubebuilder:object:root=true
type NimbusPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NimbusPolicy `json:"items"`
}

// ClusterNimbusPolicySpec is the intents a cluster binding applies across namespaces.
type ClusterNimbusPolicySpec struct {
	// +optional
	NodeSelector LabelSelector `json:"nodeSelector,omitempty"`
	// +optional
	NsSelector NamespaceSelector `json:"nsSelector,omitempty"`
	// +optional
	WorkloadSelector LabelSelector `json:"workloadSelector,omitempty"`
	NimbusRules      []NimbusRules `json:"rules"`
}

// ClusterNimbusPolicy is what a cluster binding resolves to; cluster-wide engine policies
// (Kyverno ClusterPolicies) are generated from it and owned by it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=cwnp
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Policies",type=integer,JSONPath=`.status.numberOfAdapterPolicies`
type ClusterNimbusPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterNimbusPolicySpec `json:"spec,omitempty"`
	Status NimbusPolicyStatus      `json:"status,omitempty"`
}

// ClusterNimbusPolicyList is a list of ClusterNimbusPolicies.
// +kubebuilder:object:root=true
type ClusterNimbusPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterNimbusPolicy `json:"items"`
}
