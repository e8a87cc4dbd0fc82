package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AnnotationRoleARN is the annotation EKS's pod identity webhook reads from a ServiceAccount.
const AnnotationRoleARN = "eks.amazonaws.com/role-arn"

// Mechanism is how pods of the ServiceAccount get the role's credentials.
// +kubebuilder:validation:Enum=IRSA;PodIdentity;Both
type Mechanism string

const (
	// MechanismIRSA means the ServiceAccount is annotated eks.amazonaws.com/role-arn and the role trusts
	// the cluster's OIDC provider for exactly that ServiceAccount.
	MechanismIRSA Mechanism = "IRSA"
	// MechanismPodIdentity means an EKS Pod Identity association maps the ServiceAccount to the role,
	// which trusts pods.eks.amazonaws.com.
	MechanismPodIdentity Mechanism = "PodIdentity"
	// MechanismBoth is both at once, the state a migration between them passes through.
	MechanismBoth Mechanism = "Both"
)

// IAMServiceAccountSpec is the IAM role a user asks for, for one ServiceAccount of the namespace.
// +kubebuilder:validation:XValidation:rule="self.serviceAccountName == oldSelf.serviceAccountName",message="serviceAccountName is immutable: the role's trust policy names it; create a new IAMServiceAccount for another ServiceAccount"
// +kubebuilder:validation:XValidation:rule="self.createServiceAccount == oldSelf.createServiceAccount",message="createServiceAccount is immutable"
// +kubebuilder:validation:XValidation:rule="(has(self.policies) ? size(self.policies) : 0) + (has(self.managedPolicyArns) ? size(self.managedPolicyArns) : 0) <= 20",message="a role can have at most 20 managed policies (policies and managedPolicyArns together)"
// +kubebuilder:validation:XValidation:rule="!has(self.targetRoleArn) || self.mechanism == 'PodIdentity'",message="targetRoleArn needs mechanism: PodIdentity (IRSA cannot chain to a target role, and with Both the SDKs would pick IRSA's role)"
// +kubebuilder:validation:XValidation:rule="!has(self.disableSessionTags) || !self.disableSessionTags || self.mechanism != 'IRSA'",message="disableSessionTags is a Pod Identity setting: set mechanism PodIdentity or Both"
// +kubebuilder:validation:XValidation:rule="!has(self.inlinePolicies) || !self.inlinePolicies.exists(p, p.name == 'quartermaster-target-role')",message="the inline policy name quartermaster-target-role is the operator's (it lets the role assume spec.targetRoleArn)"
// +kubebuilder:validation:XValidation:rule="!has(self.inlinePolicies) || !has(self.policies) || !self.inlinePolicies.exists(p, p.name in self.policies)",message="an inline policy has the name of an IAMPolicy in spec.policies: name them apart, so that what grants a permission is never ambiguous"
// +kubebuilder:validation:XValidation:rule="has(self.sharedRole) == has(oldSelf.sharedRole) && (!has(self.sharedRole) || self.sharedRole.name == oldSelf.sharedRole.name)",message="sharedRole.name is immutable, and sharedRole cannot be added or removed: it names another role; create a new IAMServiceAccount for it"
// +kubebuilder:validation:XValidation:rule="!has(self.sharedRole) || self.sharedRole.owner || (!has(self.policies) && !has(self.managedPolicyArns) && !has(self.inlinePolicies) && !has(self.maxSessionDuration) && !has(self.permissionsBoundaryArn))",message="a sharedRole member takes the role's permissions from its owner: declare policies, managedPolicyArns, inlinePolicies, maxSessionDuration and permissionsBoundaryArn only on the one IAMServiceAccount with sharedRole.owner: true"
// +kubebuilder:validation:XValidation:rule="!has(self.sharedRole) || !has(self.targetRoleArn)",message="targetRoleArn cannot be used with sharedRole: a shared role is reached from several clusters itself; give the role the permissions instead"
// +kubebuilder:validation:XValidation:rule="!has(self.sharedRole) || !has(self.disableSessionTags) || !self.disableSessionTags",message="disableSessionTags cannot be used with sharedRole: the shared role's trust admits each cluster's Pod Identity by its session tags (cluster, namespace, ServiceAccount)"
type IAMServiceAccountSpec struct {
	// ServiceAccountName is the ServiceAccount in this namespace whose pods assume the role.
	// Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +required
	ServiceAccountName string `json:"serviceAccountName"`

	// Policies names IAMPolicy objects of this namespace to attach to the role.
	// +kubebuilder:validation:MaxItems=20
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +listType=set
	// +optional
	Policies []string `json:"policies,omitempty"`

	// ManagedPolicyArns are existing policies (e.g. AWS-managed) to attach to the role; each must
	// match one of the operator's --allowed-policy-arns patterns.
	// +kubebuilder:validation:MaxItems=20
	// +kubebuilder:validation:items:MaxLength=2048
	// +kubebuilder:validation:items:Pattern=`^arn:aws[a-z-]*:iam::(aws|[0-9]{12}):policy/.+$`
	// +listType=set
	// +optional
	ManagedPolicyArns []string `json:"managedPolicyArns,omitempty"`

	// CreateServiceAccount false (the default) annotates an existing ServiceAccount; true creates
	// it, owned by this object. Immutable.
	// +kubebuilder:default=false
	// +optional
	CreateServiceAccount bool `json:"createServiceAccount"`

	// MaxSessionDuration of the role in seconds (AWS default 3600).
	// +kubebuilder:validation:Minimum=3600
	// +kubebuilder:validation:Maximum=43200
	// +optional
	MaxSessionDuration *int32 `json:"maxSessionDuration,omitempty"`

	// PermissionsBoundaryArn is a managed policy that bounds the role's permissions. A boundary
	// set by the operator's --permissions-boundary always wins.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^arn:aws[a-z-]*:iam::(aws|[0-9]{12}):policy/.+$`
	// +optional
	PermissionsBoundaryArn string `json:"permissionsBoundaryArn,omitempty"`

	// Mechanism is how pods get the role: IRSA (the ServiceAccount annotation), PodIdentity (an EKS
	// Pod Identity association in the operator's --eks-cluster-name), or Both, to migrate from one to
	// the other without a pod ever lacking credentials (docs/iam.md).
	// +kubebuilder:default=IRSA
	// +optional
	Mechanism Mechanism `json:"mechanism,omitempty"`

	// TargetRoleArn is a role, usually in another AWS account, whose credentials the pods get
	// instead of this object's role (EKS Pod Identity's cross-account access; mechanism
	// PodIdentity only): EKS assumes this object's role, then the target with the association's
	// external ID (status.podIdentityAssociation.externalId), which the target's trust policy must
	// require. The operator lets this object's role assume the target (an inline policy
	// quartermaster-target-role); the target's trust is the target account's to write (docs/iam.md).
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^arn:aws[a-z-]*:iam::[0-9]{12}:role/[\w+=,.@/-]+$`
	// +optional
	TargetRoleArn string `json:"targetRoleArn,omitempty"`

	// DisableSessionTags stops EKS Pod Identity from adding its six session tags (cluster,
	// namespace, ServiceAccount, …) when it assumes the role, e.g. for a target role whose trust
	// does not allow sts:TagSession.
	// +optional
	DisableSessionTags bool `json:"disableSessionTags,omitempty"`

	// InlinePolicies are the role's own policies, embedded in it: permissions no other role can be
	// given by attaching them. Each is put on the role, rewritten when its document differs in
	// meaning, and deleted from the role when dropped from this list. IAM limits a role's inline
	// policies to 10,240 characters together (whitespace not counted).
	// +kubebuilder:validation:MaxItems=10
	// +listType=map
	// +listMapKey=name
	// +optional
	InlinePolicies []InlinePolicy `json:"inlinePolicies,omitempty"`

	// SharedRole makes the pods use a role shared with IAMServiceAccounts of other clusters (or
	// namespaces) instead of a role of their own: one role, at IAM path /quartermaster-shared/,
	// whose trust policy holds one statement per IAMServiceAccount that uses it, each written
	// only by that object's operator (docs/iam.md). One of them, sharedRole.owner, writes the
	// role's permissions. Cannot be added, removed or renamed.
	// +optional
	SharedRole *SharedRole `json:"sharedRole,omitempty"`
}

// SharedRole names a role several clusters use.
// +kubebuilder:validation:XValidation:rule="self.owner || !has(self.members)",message="only the owner (sharedRole.owner: true) lists the members of a shared role"
type SharedRole struct {
	// Name is the role's name in IAM (the account's role names are one namespace, whatever
	// their path); names starting eks-sa- are the per-ServiceAccount roles'.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[\w+=,.@-]+$`
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('eks-sa-')",message="role names starting eks-sa- are the per-ServiceAccount roles'"
	// +required
	Name string `json:"name"`
	// Owner true: this object creates the role and writes its permissions (policies, inline
	// policies, boundary, session duration, description); one IAMServiceAccount, in all the
	// clusters, may own a shared role. False (a member): this object only adds its own trust
	// statement, and waits for the owner to create the role.
	// +optional
	Owner bool `json:"owner,omitempty"`
	// Members, on the owner only, are the other IAMServiceAccounts that may use the role, each
	// as <cluster>/<namespace>/<name> (the --cluster-name of its operator). The owner writes the
	// list on the role (tags quartermaster.dev/member-*); every operator checks it before it
	// writes a member's statement into the role's trust policy, removes the statements of a
	// member dropped from it, and admits only a listed member as the next owner of a role its
	// owner left. An IAMServiceAccount the owner does not list never gets the role.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=20
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9_.:=+@-]+/[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$`
	Members []string `json:"members,omitempty"`
}

// InlinePolicy is a policy embedded in the role.
type InlinePolicy struct {
	// Name is the inline policy's name in IAM.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[\w+=,.@-]+$`
	// +required
	Name string `json:"name"`
	// Document is the policy document, validated as an IAMPolicy's is.
	// +required
	Document PolicyDocument `json:"document"`
}

// PodIdentityAssociationStatus is the EKS Pod Identity association of an IAMServiceAccount.
type PodIdentityAssociationStatus struct {
	// ClusterName is the EKS cluster the association is (or is being created) in. It is recorded
	// before the association is created, so that an association whose creation was interrupted is
	// found and deleted even if the mechanism changes meanwhile.
	ClusterName string `json:"clusterName"`
	// AssociationID is the association's ID (a-…), once created or adopted.
	// +optional
	AssociationID string `json:"associationId,omitempty"`
	// AssociationARN is the association's ARN.
	// +optional
	AssociationARN string `json:"associationArn,omitempty"`
	// TargetRoleARN is the target role the association leads to (spec.targetRoleArn), as EKS holds it.
	// +optional
	TargetRoleARN string `json:"targetRoleArn,omitempty"`
	// ExternalID is the ID EKS gave the association for its target role: the target role's trust
	// policy must require it (Condition StringEquals sts:ExternalId).
	// +optional
	ExternalID string `json:"externalId,omitempty"`
}

// IAMServiceAccountStatus is what the operator last observed and did.
type IAMServiceAccountStatus struct {
	// RoleARN is the role's ARN, also set on the ServiceAccount as eks.amazonaws.com/role-arn.
	// +optional
	RoleARN string `json:"roleArn,omitempty"`
	// RoleName is the role's name: eks-sa-<namespace>-<serviceAccountName>, shortened with a hash
	// if too long.
	// +optional
	RoleName string `json:"roleName,omitempty"`
	// PodIdentityAssociation is the EKS Pod Identity association the operator made or adopted for
	// the ServiceAccount (mechanism PodIdentity or Both), until it is deleted.
	// +optional
	PodIdentityAssociation *PodIdentityAssociationStatus `json:"podIdentityAssociation,omitempty"`
	// InlinePolicies are the names of the inline policies the operator put on the role (and
	// deletes from it when they leave the spec).
	// +optional
	// +listType=set
	InlinePolicies []string `json:"inlinePolicies,omitempty"`
	// AccessReport is what IAM's last-accessed information says of the role's grants, when the
	// operator reports unused permissions (--iam-unused-after).
	// +optional
	AccessReport *AccessReport `json:"accessReport,omitempty"`
	// SharedRole is what the operator read of the shared role (spec.sharedRole).
	// +optional
	SharedRole *SharedRoleStatus `json:"sharedRole,omitempty"`
	// AttachedPolicyArns are the policies attached to the role, as last observed.
	// +optional
	// +listType=set
	AttachedPolicyArns []string `json:"attachedPolicyArns,omitempty"`
	// Conditions: Ready, Reconciling, Stalled.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the generation of the spec last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Access report states.
const (
	AccessReportPending = "Pending" // IAM's job runs; Unused is the previous answer
	AccessReportCurrent = "Current" // Unused is IAM's answer as of checkedAt
	AccessReportUnknown = "Unknown" // IAM gave no answer; message says why
)

// AccessReport is the role's grants IAM saw unused.
type AccessReport struct {
	// State is Pending, Current or Unknown.
	State string `json:"state"`
	// Message says what was found, or why nothing is known.
	// +optional
	Message string `json:"message,omitempty"`
	// Unused are the services the role's policies grant that it has not used within the
	// operator's --iam-unused-after, and, within services IAM tracks by action and that are used,
	// the granted actions it has not used; each with the policies that grant it.
	// +optional
	// +listType=atomic
	Unused []UnusedGrant `json:"unused,omitempty"`
	// CheckedAt is when IAM last answered (or failed to).
	// +optional
	CheckedAt *metav1.Time `json:"checkedAt,omitempty"`
	// JobID is IAM's last-accessed job in progress.
	// +optional
	JobID string `json:"jobId,omitempty"`
	// JobStarted is when that job was started.
	// +optional
	JobStarted *metav1.Time `json:"jobStarted,omitempty"`
}

// UnusedGrant is a granted service, or some of its actions, that the role has not used.
type UnusedGrant struct {
	// Service is the service's namespace (s3, sqs, …).
	Service string `json:"service"`
	// Actions are the unused actions of a service that is otherwise used; empty: the whole service
	// is unused.
	// +optional
	// +listType=atomic
	Actions []string `json:"actions,omitempty"`
	// GrantedBy names the policies that grant it: IAMPolicy <name>, inline policy <name>, or a
	// managed policy's ARN.
	// +optional
	// +listType=atomic
	GrantedBy []string `json:"grantedBy,omitempty"`
}

// SharedRoleStatus is the shared role as last read.
type SharedRoleStatus struct {
	// Owner is the IAMServiceAccount that writes the role's permissions, as
	// <cluster>/<namespace>/<name>; empty when it left and no other has taken over (the
	// permissions stay as it left them).
	// +optional
	Owner string `json:"owner,omitempty"`
	// TrustedBy are the ServiceAccounts the role's trust policy admits through Quartermaster's
	// statements, in every cluster (at most 20 listed).
	// +optional
	// +listType=atomic
	TrustedBy []string `json:"trustedBy,omitempty"`
	// Members are the IAMServiceAccounts the owner lists on the role as allowed to use it.
	// +optional
	// +listType=atomic
	Members []string `json:"members,omitempty"`
}

// IAMServiceAccount is an IAM role for one ServiceAccount, owned by this object, that its pods get
// through IRSA, EKS Pod Identity, or both.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=iamsa,categories=quartermaster
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Role",type=string,JSONPath=`.status.roleArn`
// +kubebuilder:printcolumn:name="ServiceAccount",type=string,JSONPath=`.spec.serviceAccountName`,priority=1
// +kubebuilder:printcolumn:name="Mechanism",type=string,JSONPath=`.spec.mechanism`,priority=1
// +kubebuilder:printcolumn:name="Association",type=string,JSONPath=`.status.podIdentityAssociation.associationId`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IAMServiceAccount struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec IAMServiceAccountSpec `json:"spec"`
	// +optional
	Status IAMServiceAccountStatus `json:"status,omitempty"`
}

// IAMServiceAccountList is a list of IAMServiceAccounts.
// +kubebuilder:object:root=true
type IAMServiceAccountList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IAMServiceAccount `json:"items"`
}
