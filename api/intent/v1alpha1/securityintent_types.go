package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Intent is what must not happen, by its catalogue id, and what to do when it is attempted.
// Rules iterate over the params' keys: selecting a key (self.params.psaLevel) makes the API
// server's cost estimate unbounded.
// +kubebuilder:validation:XValidation:rule="self.id != 'escapeToHost' || !has(self.params) || self.params.all(k, !(k in ['psaLevel', 'psa_level']) || self.params[k].all(v, v in ['baseline', 'restricted']))",message="params.psaLevel must be baseline or restricted (the pod security level escapeToHost enforces)"
// +kubebuilder:validation:XValidation:rule="self.id != 'virtualPatch' || !has(self.params) || self.params.all(k, !(k in ['cveList', 'cve_list']) || self.params[k].all(v, v.matches('^CVE-[0-9]{4}-[0-9]{4,}$')))",message="params.cveList entries must be CVE ids such as CVE-2024-4439"
// +kubebuilder:validation:XValidation:rule="self.id != 'cocoWorkload' || !has(self.params) || self.params.all(k, k != 'runtimeClass' || (size(self.params[k]) == 1 && self.params[k][0].matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')))",message="params.runtimeClass must be one RuntimeClass name"
type Intent struct {
	// ID names the intent in the catalogue (e.g. dnsManipulation, escapeToHost). An id no engine
	// implements is accepted; the policies it is bound into say that nothing enforces it.
	// +kubebuilder:validation:Pattern:="^[a-zA-Z0-9]*$"
	// +kubebuilder:validation:MaxLength=63
	ID string `json:"id"`

	// Description is carried into the generated policies' messages.
	// +optional
	Description string `json:"description,omitempty"`

	// Action is Block (enforce) or Audit (report only).
	// +kubebuilder:validation:Enum=Block;Audit
	Action string `json:"action"`

	// Severity is informational.
	// +kubebuilder:default:=Low
	// +optional
	Severity string `json:"severity,omitempty"`

	// Tags are informational.
	// +optional
	Tags []string `json:"tags,omitempty"`

	// Params tune an intent (psaLevel for escapeToHost, runtimeClass for cocoWorkload, cveList
	// and schedule for virtualPatch, schedule and external_addresses for assessTLS).
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	Params map[string]ParamValues `json:"params,omitempty"`
}

// ParamValues are the values of one param (a list even for one value, as in Nimbus).
// +kubebuilder:validation:MaxItems=64
// +kubebuilder:validation:items:MaxLength=253
type ParamValues []string

// SecurityIntentSpec is one intent.
type SecurityIntentSpec struct {
	Intent Intent `json:"intent"`
}

// SecurityIntentStatus repeats the intent's id and action, as Nimbus shows them, with conditions.
type SecurityIntentStatus struct {
	ID     string `json:"id"`
	Action string `json:"action"`
	// Status is Created once the intent is processed.
	Status string `json:"status"`

	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, Reconciling, Stalled.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Impact is what the engines' scans found against the intent's policies, across all its
	// bindings.
	// +optional
	Impact *Impact `json:"impact,omitempty"`
	// Exceptions are the SecurityIntentExceptions (security.quartermaster.dev) naming the intent,
	// the first MaxListedExceptions by namespace/name.
	// +kubebuilder:validation:MaxItems=20
	// +optional
	Exceptions []IntentException `json:"exceptions,omitempty"`
}

// MaxListedExceptions is how many exceptions an intent's status lists.
const MaxListedExceptions = 20

// IntentException is one exception to an intent, as its status shows it.
type IntentException struct {
	// Name is the exception's namespace/name.
	Name string `json:"name"`
	// Owner answers for it.
	Owner string `json:"owner"`
	// Expires is when it ends.
	Expires metav1.Time `json:"expires"`
	// State is the exception's Ready reason (Exempting, ExpiresSoon, Expired, or why it is refused).
	// +optional
	State string `json:"state,omitempty"`
	// Exempted is how many workloads Kyverno skipped under it, by its reports.
	// +optional
	Exempted *int32 `json:"exempted,omitempty"`
}

// SecurityIntent states what must not happen; bindings apply it to workloads.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=si
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Violations",type=integer,JSONPath=`.status.impact.violations`
// +kubebuilder:printcolumn:name="ID",type=string,JSONPath=`.spec.intent.id`,priority=1
// +kubebuilder:printcolumn:name="Action",type=string,JSONPath=`.spec.intent.action`,priority=1
type SecurityIntent struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SecurityIntentSpec   `json:"spec,omitempty"`
	Status SecurityIntentStatus `json:"status,omitempty"`
}

// SecurityIntentList is a list of SecurityIntents.
// +kubebuilder:object:root=true
type SecurityIntentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SecurityIntent `json:"items"`
}
