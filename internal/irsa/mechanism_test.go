package irsa

import (
	"fmt"
	"strings"
	"testing"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

const (
	irsaStatement = `{"Effect":"Allow",` +
		`"Principal":{"Federated":"arn:aws:iam::123456789012:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/ABC"},` +
		`"Action":"sts:AssumeRoleWithWebIdentity",` +
		`"Condition":{"StringEquals":{` +
		`"oidc.eks.eu-west-1.amazonaws.com/id/ABC:aud":"sts.amazonaws.com",` +
		`"oidc.eks.eu-west-1.amazonaws.com/id/ABC:sub":"system:serviceaccount:team-a:app"}}}`
	podIdentityStatement = `{"Effect":"Allow","Principal":{"Service":"pods.eks.amazonaws.com"},"Action":["sts:AssumeRole","sts:TagSession"]}`
)

func trustFor(p Parts) string {
	return TrustPolicy("aws", "123456789012", "https://oidc.eks.eu-west-1.amazonaws.com/id/ABC", "team-a", "app", p)
}

// TestTrustPolicyPerMechanism: each mechanism's trust document, exactly.
func TestTrustPolicyPerMechanism(t *testing.T) {
	for _, tc := range []struct {
		mechanism iamv1alpha1.Mechanism
		want      string
	}{
		{iamv1alpha1.MechanismIRSA, `{"Version":"2012-10-17","Statement":[` + irsaStatement + `]}`},
		{"", `{"Version":"2012-10-17","Statement":[` + irsaStatement + `]}`},
		{iamv1alpha1.MechanismPodIdentity, `{"Version":"2012-10-17","Statement":[` + podIdentityStatement + `]}`},
		{iamv1alpha1.MechanismBoth, `{"Version":"2012-10-17","Statement":[` + irsaStatement + `,` + podIdentityStatement + `]}`},
	} {
		if got := trustFor(Needs(tc.mechanism)); got != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.mechanism, got, tc.want)
		}
	}
}

// TestTrustPolicyEquivalence: what IAM answers for a Pod Identity trust policy (encoded, actions in
// another order, one statement order or the other) causes no rewrite; a different set of
// mechanisms does.
func TestTrustPolicyEquivalence(t *testing.T) {
	both := trustFor(Parts{Annotation: true, Association: true})
	reordered := `{"Version":"2012-10-17","Statement":[` +
		`{"Action":["sts:TagSession","sts:AssumeRole"],"Effect":"Allow","Principal":{"Service":["pods.eks.amazonaws.com"]}},` + irsaStatement + `]}`
	if eq, err := Equivalent(both, encodeLikeIAM(reordered)); err != nil || !eq {
		t.Errorf("Both and its IAM form: equivalent = %v, %v", eq, err)
	}
	pairs := []Parts{{Annotation: true}, {Association: true}, {Annotation: true, Association: true}}
	for i, a := range pairs {
		for j, b := range pairs {
			eq, err := Equivalent(trustFor(a), trustFor(b))
			if err != nil || eq != (i == j) {
				t.Errorf("Equivalent(%v, %v) = %v, %v", a, b, eq, err)
			}
		}
	}
}

func encodeLikeIAM(doc string) string {
	r := strings.NewReplacer("{", "%7B", "}", "%7D", `"`, "%22", ":", "%3A", ",", "%2C", "[", "%5B", "]", "%5D", "/", "%2F")
	return r.Replace(doc)
}

func TestNeeds(t *testing.T) {
	for m, want := range map[iamv1alpha1.Mechanism]Parts{
		iamv1alpha1.MechanismIRSA:        {Annotation: true},
		"":                               {Annotation: true},
		iamv1alpha1.MechanismPodIdentity: {Association: true},
		iamv1alpha1.MechanismBoth:        {Annotation: true, Association: true},
	} {
		if got := Needs(m); got != want {
			t.Errorf("Needs(%q) = %v, want %v", m, got, want)
		}
	}
}

// TestPartsNames: each vocabulary names the same parts in the same order.
func TestPartsNames(t *testing.T) {
	for _, tc := range []struct {
		p                          Parts
		parts, trusted, mechanisms string
	}{
		{none, "nothing", "nobody", "none"},
		{annotation, "annotation", "OIDC provider", "IRSA"},
		{association, "association", "pods.eks.amazonaws.com", "EKS Pod Identity"},
		{bothParts, "annotation and association", "OIDC provider and pods.eks.amazonaws.com", "IRSA and EKS Pod Identity"},
	} {
		if got := [3]string{tc.p.String(), tc.p.Trusted(), tc.p.Mechanisms()}; got != [3]string{tc.parts, tc.trusted, tc.mechanisms} {
			t.Errorf("%#v: String, Trusted, Mechanisms = %q, want %q", tc.p, got, [3]string{tc.parts, tc.trusted, tc.mechanisms})
		}
	}
}

// TestNeedsIssuer: IRSA and Both need --oidc-issuer, PodIdentity does not, except while a change
// away from IRSA keeps the role trusting the annotation still in place.
func TestNeedsIssuer(t *testing.T) {
	for m, want := range map[iamv1alpha1.Mechanism]bool{
		iamv1alpha1.MechanismIRSA: true, "": true, iamv1alpha1.MechanismBoth: true, iamv1alpha1.MechanismPodIdentity: false,
	} {
		if got := Needs(m).NeedsIssuer(); got != want {
			t.Errorf("Needs(%q).NeedsIssuer() = %v, want %v", m, got, want)
		}
	}
	for _, tc := range []struct {
		have Parts
		want bool
	}{{none, false}, {association, false}, {annotation, true}, {bothParts, true}} {
		if got := Plan(iamv1alpha1.MechanismPodIdentity, tc.have).Trust.NeedsIssuer(); got != tc.want {
			t.Errorf("Plan(PodIdentity, have %v).Trust.NeedsIssuer() = %v, want %v", tc.have, got, tc.want)
		}
	}
}

var (
	none        = Parts{}
	annotation  = Parts{Annotation: true}
	association = Parts{Association: true}
	bothParts   = Parts{Annotation: true, Association: true}
)

// TestPlan is the table of transitions: from every set of parts a ServiceAccount can have to every
// mechanism.
func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		to   iamv1alpha1.Mechanism
		have Parts
		want Transition
	}{
		// New objects.
		{iamv1alpha1.MechanismIRSA, none, Transition{Trust: annotation, Add: annotation, FinalTrust: annotation}},
		{iamv1alpha1.MechanismPodIdentity, none, Transition{Trust: association, Add: association, FinalTrust: association}},
		{iamv1alpha1.MechanismBoth, none, Transition{Trust: bothParts, Add: bothParts, FinalTrust: bothParts}},
		// At rest: nothing to do.
		{iamv1alpha1.MechanismIRSA, annotation, Transition{Trust: annotation, FinalTrust: annotation}},
		{iamv1alpha1.MechanismPodIdentity, association, Transition{Trust: association, FinalTrust: association}},
		{iamv1alpha1.MechanismBoth, bothParts, Transition{Trust: bothParts, FinalTrust: bothParts}},
		// IRSA → Both → PodIdentity, the migration.
		{iamv1alpha1.MechanismBoth, annotation, Transition{Trust: bothParts, Add: association, FinalTrust: bothParts}},
		{iamv1alpha1.MechanismPodIdentity, bothParts, Transition{Trust: bothParts, Remove: annotation, FinalTrust: association}},
		// PodIdentity → Both → IRSA, the way back.
		{iamv1alpha1.MechanismBoth, association, Transition{Trust: bothParts, Add: annotation, FinalTrust: bothParts}},
		{iamv1alpha1.MechanismIRSA, bothParts, Transition{Trust: bothParts, Remove: association, FinalTrust: annotation}},
		// Directly from one to the other: the new part first, the old one after, trust narrowed last.
		{iamv1alpha1.MechanismPodIdentity, annotation, Transition{Trust: bothParts, Add: association, Remove: annotation, FinalTrust: association}},
		{iamv1alpha1.MechanismIRSA, association, Transition{Trust: bothParts, Add: annotation, Remove: association, FinalTrust: annotation}},
	} {
		if got := Plan(tc.to, tc.have); got != tc.want {
			t.Errorf("Plan(%s, have %v) = %+v, want %+v", tc.to, tc.have, got, tc.want)
		}
	}
}

// TestPlanNeverLeavesAGap runs every transition step by step, failing after each step in turn (and
// then resuming with a fresh Plan, as the next reconcile does), and checks every intermediate state:
// a ServiceAccount that had a working part always has one — a part whose mechanism the role's trust
// policy admits.
func TestPlanNeverLeavesAGap(t *testing.T) {
	mechanisms := []iamv1alpha1.Mechanism{iamv1alpha1.MechanismIRSA, iamv1alpha1.MechanismPodIdentity, iamv1alpha1.MechanismBoth}
	for _, from := range mechanisms {
		for _, to := range mechanisms {
			for failAfter := range 5 {
				name := fmt.Sprintf("%s→%s failing after step %d", from, to, failAfter)
				have, trust := Needs(from), Needs(from)
				works := func(step string) {
					irsaWorks, podIdentityWorks := have.Annotation && trust.Annotation, have.Association && trust.Association
					if !irsaWorks && !podIdentityWorks {
						t.Errorf("%s: after %s the ServiceAccount has %v and the role trusts %v: no credentials", name, step, have, trust)
					}
				}
				// The first reconcile stops after failAfter steps; the second completes.
				for round, limit := range []int{failAfter, 4} {
					tr := Plan(to, have)
					steps := []func(){
						func() { trust = tr.Trust },
						func() { have = have.union(tr.Add) },
						func() { have = have.minus(tr.Remove) },
						func() { trust = tr.FinalTrust },
					}
					for i, step := range steps[:min(limit, len(steps))] {
						step()
						works(fmt.Sprintf("round %d step %d", round, i+1))
					}
				}
				if have != Needs(to) || trust != Needs(to) {
					t.Errorf("%s: ends with %v trusting %v, want %v", name, have, trust, Needs(to))
				}
			}
		}
	}
}

func TestValidEKSClusterName(t *testing.T) {
	for name, ok := range map[string]bool{
		"prod": true, "prod-eu_1": true, "0abc": true, strings.Repeat("a", 100): true,
		"": false, "-prod": false, "prod.eu": false, "prod eu": false, strings.Repeat("a", 101): false,
	} {
		err := ValidEKSClusterName(name, "--eks-cluster-name")
		if (err == nil) != ok {
			t.Errorf("ValidEKSClusterName(%q) = %v, want ok=%v", name, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--eks-cluster-name") {
			t.Errorf("the error does not name the flag: %v", err)
		}
	}
}
