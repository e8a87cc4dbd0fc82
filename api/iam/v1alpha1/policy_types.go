package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PolicyDocument is an IAM identity-based policy document, field names as AWS writes them, so a
// document from the AWS documentation carries over. Lists are always lists in YAML: write
// `Action: ["s3:GetObject"]`, not a bare string.
type PolicyDocument struct {
	// Version is the policy language version.
	// +kubebuilder:validation:Enum="2012-10-17";"2008-10-17"
	// +required
	Version string `json:"Version"`

	// Id is an optional identifier of the document.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Id string `json:"Id,omitempty"` //nolint:revive,staticcheck // AWS's spelling of the field

	// Statement lists the document's statements.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	// +listType=atomic
	// +required
	Statement []Statement `json:"Statement"`
}

// Statement is one statement of a policy document. It names either Action or NotAction, and either
// Resource or NotResource.
// +kubebuilder:validation:XValidation:rule="has(self.Action) != has(self.NotAction)",message="a statement needs exactly one of Action and NotAction"
// +kubebuilder:validation:XValidation:rule="has(self.Resource) != has(self.NotResource)",message="a statement needs exactly one of Resource and NotResource"
type Statement struct {
	// Sid is an optional statement identifier (letters and digits).
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]*$`
	// +optional
	Sid string `json:"Sid,omitempty"`

	// Effect is Allow or Deny.
	// +kubebuilder:validation:Enum=Allow;Deny
	// +required
	Effect string `json:"Effect"`

	// Action lists the actions the statement covers, e.g. "s3:GetObject", "s3:List*" or "*".
	// +optional
	Action Actions `json:"Action,omitempty"`

	// NotAction lists the actions the statement does not cover.
	// +optional
	NotAction Actions `json:"NotAction,omitempty"`

	// Resource lists the ARNs the statement covers, or "*".
	// +optional
	Resource Resources `json:"Resource,omitempty"`

	// NotResource lists the ARNs the statement does not cover.
	// +optional
	NotResource Resources `json:"NotResource,omitempty"`

	// Condition maps a condition operator (StringEquals, …) to condition keys and their values,
	// e.g. {"StringEquals": {"aws:RequestedRegion": ["eu-west-1"]}}.
	// +kubebuilder:validation:MaxProperties=20
	// +kubebuilder:validation:XValidation:rule="self.all(op, op.matches('^(ForAllValues:|ForAnyValue:)?((String(Not)?Equals(IgnoreCase)?|String(Not)?Like|Numeric(Not)?Equals|NumericLessThan(Equals)?|NumericGreaterThan(Equals)?|Date(Not)?Equals|DateLessThan(Equals)?|DateGreaterThan(Equals)?|Bool|BinaryEquals|(Not)?IpAddress|Arn(Not)?Equals|Arn(Not)?Like)(IfExists)?|Null)$'))",message="a Condition operator must be one of IAM's (StringEquals, StringLike, NumericLessThan, DateGreaterThan, Bool, IpAddress, ArnLike, Null, …), optionally prefixed ForAllValues: or ForAnyValue: and suffixed IfExists"
	// +optional
	Condition map[string]ConditionValues `json:"Condition,omitempty"`
}

// Actions is a non-empty list of IAM actions ("service:Action", wildcards allowed, or "*").
// +kubebuilder:validation:MinItems=1
// +kubebuilder:validation:MaxItems=200
// +kubebuilder:validation:items:MaxLength=128
// +kubebuilder:validation:items:Pattern=`^(\*|[A-Za-z0-9-]+:[A-Za-z0-9*?]+)$`
// +listType=atomic
type Actions []string

// Resources is a non-empty list of resource ARNs (wildcards allowed) or "*".
// +kubebuilder:validation:MinItems=1
// +kubebuilder:validation:MaxItems=200
// +kubebuilder:validation:items:MaxLength=2048
// +kubebuilder:validation:items:Pattern=`^(\*|arn:[^:]+:[^:]*:[^:]*:[^:]*:.+)$`
// +listType=atomic
type Resources []string

// ConditionValues maps condition keys to their values (always a list; booleans as "true"/"false").
// +kubebuilder:validation:MinProperties=1
// +kubebuilder:validation:MaxProperties=20
type ConditionValues map[string][]string

// IAMPolicySpec is the managed policy a user asks for.
type IAMPolicySpec struct {
	// Document is the policy document. A change becomes a new default policy version.
	// +required
	Document PolicyDocument `json:"document"`

	// Description of the policy in AWS. AWS cannot change a policy's description: it is used when
	// the policy is created.
	// +kubebuilder:validation:MaxLength=1000
	// +optional
	Description string `json:"description,omitempty"`
}

// IAMPolicyStatus is what the operator last observed and did.
type IAMPolicyStatus struct {
	// ARN of the policy in AWS.
	// +optional
	ARN string `json:"arn,omitempty"`
	// PolicyName is the policy's name in AWS: <namespace>-<name>, shortened with a hash if too long.
	// +optional
	PolicyName string `json:"policyName,omitempty"`
	// PolicyID is AWS's unique ID of the policy.
	// +optional
	PolicyID string `json:"policyId,omitempty"`
	// DefaultVersionID is the policy version in force, e.g. v3.
	// +optional
	DefaultVersionID string `json:"defaultVersionId,omitempty"`
	// Conditions: Ready, Reconciling, Stalled.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the generation of the spec last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// IAMPolicy is an AWS IAM customer-managed policy owned by this object.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=iampol,categories=quartermaster
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="ARN",type=string,JSONPath=`.status.arn`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IAMPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec IAMPolicySpec `json:"spec"`
	// +optional
	Status IAMPolicyStatus `json:"status,omitempty"`
}

// IAMPolicyList is a list of IAMPolicies.
// +kubebuilder:object:root=true
type IAMPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IAMPolicy `json:"items"`
}
