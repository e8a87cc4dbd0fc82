package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TrustedIssuerSpec says whose job tokens are exchanged for namespaces, and which namespace each
// may have.
type TrustedIssuerSpec struct {
	// IssuerURL is the issuer exactly as its tokens' iss claim says it (GitHub Actions:
	// https://token.actions.githubusercontent.com; GitLab: https://gitlab.com or your instance);
	// its discovery document is read from <issuerURL>/.well-known/openid-configuration. One
	// TrustedIssuer per issuer URL.
	// +kubebuilder:validation:MinLength=9
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^https://[^\s?#]+$`
	// +required
	IssuerURL string `json:"issuerURL"`

	// Audience is the aud the tokens must carry: the job asks its CI system for a token with this
	// audience (GitHub: core.getIDToken(audience); GitLab: id_tokens.<name>.aud). Use something
	// that names this cluster, so a token made for another service is never accepted here.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +required
	Audience string `json:"audience"`

	// IdentityClaim names the claim that says whose namespaces these are (GitHub: repository;
	// GitLab: project_path): the namespace records it, another identity cannot take that
	// namespace, and MaxNamespacesPerIdentity counts by it. The token must have it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:-]+$`
	// +required
	IdentityClaim string `json:"identityClaim"`

	// MaxNamespacesPerIdentity is how many live namespaces one identity may hold through this
	// issuer; a request beyond it is refused, naming the oldest. Unset: no limit.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxNamespacesPerIdentity *int32 `json:"maxNamespacesPerIdentity,omitempty"`

	// Rules admit tokens by their claims, the first that matches deciding the namespace. A token no
	// rule admits is refused, the refusal listing the claims the rules read.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=50
	// +listType=map
	// +listMapKey=name
	// +required
	Rules []IssuerRule `json:"rules"`
}

// IssuerRule admits the tokens whose claims match and names their namespace.
type IssuerRule struct {
	// Name identifies the rule in messages and Events.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`

	// Claims maps a claim to patterns (* matches any run of characters, / included); the claim's
	// value must match one of them, for every claim listed. E.g. repository: ["acme/*"],
	// event_name: ["pull_request"].
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=16
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) >= 1 && size(self[k]) <= 32)",message="each claim needs 1 to 32 patterns"
	// +required
	Claims map[string][]string `json:"claims"`

	// Namespace is the template of the namespace name, from the claims: text (a-z, 0-9, -) and
	// {claim} or {claim|last} (after the last /) or {claim|pull} (N of refs/pull/N/…). Values are
	// lower-cased, other characters become -; a result that is no DNS label is refused, never cut.
	// E.g. ci-{repository|last}-pr-{ref|pull}.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9-]|\{[A-Za-z0-9_.:-]+(\|(last|pull))?\})+$`
	// +required
	Namespace string `json:"namespace"`

	// TTL is how long the namespace lives (deleted after, as a request's ttl); a job may ask for
	// less. Unset: the operator's --max-ttl, or for ever when that is unset.
	// +optional
	TTL *metav1.Duration `json:"ttl,omitempty"`

	// TokenTTL is the lifetime of the namespace's handed-out token (at least 10m); a job may ask
	// for less. Unset: the operator's --token-ttl.
	// +optional
	TokenTTL *metav1.Duration `json:"tokenTTL,omitempty"`

	// Defaults names the profile of the operator's namespace defaults (--namespace-defaults,
	// profiles.<name>) that the rule's namespaces get: their quota, limits, network isolation and
	// copies. Unset: the defaults' top level, as every ConfigMap request gets. A profile the
	// defaults do not define makes the issuer not Ready and the exchange refuse the rule's jobs.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Defaults string `json:"defaults,omitempty"`
}

// TrustedIssuerStatus is what the operator last saw of the issuer.
type TrustedIssuerStatus struct {
	// Conditions: Ready (the discovery document and keys were read).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the generation of the spec last checked.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// TrustedIssuer is an OIDC issuer of CI job tokens that the namespaces controller exchanges for
// namespaces (docs/namespaces.md, "Keyless pipelines").
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=tiss,categories=quartermaster
// +kubebuilder:printcolumn:name="Issuer",type=string,JSONPath=`.spec.issuerURL`
// +kubebuilder:printcolumn:name="Audience",type=string,JSONPath=`.spec.audience`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TrustedIssuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TrustedIssuerSpec `json:"spec"`
	// +optional
	Status TrustedIssuerStatus `json:"status,omitempty"`
}

// TrustedIssuerList is a list of TrustedIssuers.
// +kubebuilder:object:root=true
type TrustedIssuerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TrustedIssuer `json:"items"`
}
