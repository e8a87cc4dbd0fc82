package irsa

import (
	"fmt"
	"regexp"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

// Parts are what gives the pods of a ServiceAccount an IAM role: the IRSA annotation
// (eks.amazonaws.com/role-arn, set by the IAMServiceAccount) and the EKS Pod Identity association.
// The same type says which mechanisms a trust policy admits: the web-identity statement goes with
// the annotation, the pods.eks.amazonaws.com statement with the association.
type Parts struct {
	Annotation  bool
	Association bool
}

func (p Parts) union(q Parts) Parts {
	return Parts{Annotation: p.Annotation || q.Annotation, Association: p.Association || q.Association}
}

func (p Parts) minus(q Parts) Parts {
	return Parts{Annotation: p.Annotation && !q.Annotation, Association: p.Association && !q.Association}
}

// String names the parts for messages: "annotation", "association", "annotation and association"
// or "nothing".
func (p Parts) String() string { return p.join("annotation", "association", "nothing") }

// Trusted names, for messages, what a trust policy admitting the parts trusts: "OIDC provider",
// "pods.eks.amazonaws.com", both, or "nobody".
func (p Parts) Trusted() string { return p.join("OIDC provider", PodIdentityPrincipal, "nobody") }

// Mechanisms names the mechanisms the parts serve: "IRSA", "EKS Pod Identity", both, or "none".
func (p Parts) Mechanisms() string { return p.join("IRSA", "EKS Pod Identity", "none") }

// join says the parts in one vocabulary: the annotation's word first, "and" between, none for
// neither. Every way of naming parts goes through it, so they never disagree.
func (p Parts) join(annotation, association, none string) string {
	switch {
	case p.Annotation && p.Association:
		return annotation + " and " + association
	case p.Annotation:
		return annotation
	case p.Association:
		return association
	}
	return none
}

// Needs is which parts a mechanism needs: the one place that says it. An empty mechanism (an object
// written before the field existed, before the API server defaults it) is IRSA.
func Needs(m iamv1alpha1.Mechanism) Parts {
	switch m {
	case iamv1alpha1.MechanismPodIdentity:
		return Parts{Association: true}
	case iamv1alpha1.MechanismBoth:
		return Parts{Annotation: true, Association: true}
	default:
		return Parts{Annotation: true}
	}
}

// NeedsIssuer says whether a trust policy admitting the parts p needs the cluster's OIDC issuer
// (--oidc-issuer): the IRSA statement federates the cluster's OIDC provider, the Pod Identity
// statement only names a service. The one place that says which mechanisms need it:
// Needs(m).NeedsIssuer() for a mechanism, Plan(m, have).Trust.NeedsIssuer() during a change.
func (p Parts) NeedsIssuer() bool {
	return p.Annotation
}

// Transition is how the controller moves a ServiceAccount from the parts it has to the parts its
// mechanism needs without leaving any pod without credentials, in this order:
//
//  1. the role's trust policy is set to Trust, which admits every mechanism that has or will have
//     its part, so neither running pods nor new ones are refused by STS during the change;
//  2. the Add parts are created and confirmed;
//  3. only then are the Remove parts removed (a failure in 2 leaves them in place);
//  4. and only then is the trust policy narrowed to FinalTrust.
//
// The controller stops at the first step that fails and starts again from step 1 at the next
// reconcile, so at every moment the ServiceAccount has at least one part that works. When nothing
// changes, Trust equals FinalTrust and Add and Remove are empty.
type Transition struct {
	Trust      Parts
	Add        Parts
	Remove     Parts
	FinalTrust Parts
}

// Plan is the Transition from the parts a ServiceAccount has to those mechanism m needs.
func Plan(m iamv1alpha1.Mechanism, have Parts) Transition {
	want := Needs(m)
	return Transition{
		Trust:      want.union(have),
		Add:        want.minus(have),
		Remove:     have.minus(want),
		FinalTrust: want,
	}
}

// eksClusterName is EKS's rule for a cluster name (CreateCluster: 1–100 characters, a letter or
// digit first, then letters, digits, hyphens and underscores).
var eksClusterName = regexp.MustCompile(`^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$`)

// ValidEKSClusterName checks the cluster name pod identity associations are made in, naming the
// flag it came from.
func ValidEKSClusterName(name, flag string) error {
	if !eksClusterName.MatchString(name) {
		return fmt.Errorf("%s %q is not an EKS cluster name (1–100 letters, digits, - and _, starting with a letter or digit)", flag, name)
	}
	return nil
}
