// Package v1alpha1 is the iam.quartermaster.dev/v1alpha1 API: IAMPolicy, an AWS IAM managed policy,
// and IAMServiceAccount, an IAM role a Kubernetes ServiceAccount assumes through the cluster's OIDC
// provider (IRSA), an EKS Pod Identity association, or both.
// +kubebuilder:object:generate=true
// +groupName=iam.quartermaster.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "iam.quartermaster.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the API's kinds with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&IAMPolicy{}, &IAMPolicyList{},
		&IAMServiceAccount{}, &IAMServiceAccountList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Condition types of both kinds (kstatus: Ready summarizes, Reconciling and Stalled qualify).
const (
	ConditionReady       = "Ready"
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
)

// AnnotationDeletionPolicy on an IAMPolicy or IAMServiceAccount set to DeletionPolicyRetain keeps
// its AWS objects when the Kubernetes object is deleted.
const (
	AnnotationDeletionPolicy = "quartermaster.dev/deletion-policy"
	DeletionPolicyRetain     = "retain"
)

// AnnotationAdopt opts an object in to adopting the AWS object of its generated name that exists
// without Quartermaster's tags (made by the scripts it replaces): the controller tags it as the
// object's, then manages it. On an IAMServiceAccount the value is "true" (a role is found by name
// wherever its path). On an IAMPolicy it is "true" for a policy on the operator's path, or the IAM
// path the policy was created with ("/" for the scripts' default), which must stay: it says where
// the policy is. An AWS object carrying another Quartermaster object's tags is never adopted.
const AnnotationAdopt = "quartermaster.dev/adopt"
