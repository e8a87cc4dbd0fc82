package iam

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const (
	sharedName  = "payments"
	eastIssuer  = "https://oidc.example.com/id/EAST"
	breakGlass  = "BreakGlass"
	eastCluster = otherEKSCluster // the second cluster's --cluster-name, also its EKS cluster
)

// trustSids lists the statement IDs of a trust policy as the emulator holds it.
func trustSids(t *testing.T, doc string) []string {
	t.Helper()
	if !strings.HasPrefix(strings.TrimSpace(doc), "{") {
		d, err := url.PathUnescape(doc)
		must(t, err)
		doc = d
	}
	var d struct {
		Statement []struct{ Sid string } `json:"Statement"`
	}
	must(t, json.Unmarshal([]byte(doc), &d))
	var out []string
	for _, st := range d.Statement {
		out = append(out, st.Sid)
	}
	return out
}

// members is how many members' statements the shared role's trust holds, and whether the
// hand-written statement is still there.
func (f *fixture) sharedTrust(t *testing.T) (members int, handWritten bool, doc string) {
	t.Helper()
	r := f.role(sharedName)
	if r == nil {
		return 0, false, ""
	}
	for _, sid := range trustSids(t, r.AssumeRolePolicyDocument) {
		switch {
		case sid == breakGlass:
			handWritten = true
		case strings.HasPrefix(sid, "QuartermasterIrsa"), strings.HasPrefix(sid, "QuartermasterPodIdentity"):
			members++
		}
	}
	return members, handWritten, r.AssumeRolePolicyDocument
}

func sharedSpec(owner bool, m iamv1alpha1.Mechanism) iamv1alpha1.IAMServiceAccountSpec {
	return iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "app", Mechanism: m,
		SharedRole: &iamv1alpha1.SharedRole{Name: sharedName, Owner: owner}}
}

// TestSharedRoleAcrossClusters runs two clusters, each with its API server and its operator (its
// own --cluster-name, OIDC issuer and EKS cluster), against one emulated AWS account, and shares
// one role between their IAMServiceAccounts: each operator writes only its members' statements of
// the role's trust policy, including when both write at the same moment, and one owner writes the
// permissions.
func TestSharedRoleAcrossClusters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Two clusters of their own: an operator serves every IAM object of its API server, and
	// TestIAM's runs on the package's.
	west := start(t, testenv.Start(t))
	west.opts.SharedRoleNamespaces = "team*,outsider"
	east := west.otherCluster(t, eastCluster, eastIssuer)
	west.run(t, west.opts)
	east.run(t, east.opts)
	for _, c := range []*fixture{west, east} {
		for _, ns := range []string{"team", "team2"} {
			c.namespace(t, ns)
			c.serviceAccount(t, ns, "app")
		}
	}

	// A member made before the role waits for its owner.
	eastApp := east.iamsa(t, "team", "app", sharedSpec(false, iamv1alpha1.MechanismPodIdentity))
	waitCondition(t, east, eastApp, ReasonSharedRoleNotFound)
	ownerSpec := sharedSpec(true, iamv1alpha1.MechanismIRSA)
	ownerSpec.SharedRole.Members = []string{"other/team/app", "test/team2/app", "other/team2/app"}
	for i := 3; i <= 8; i++ {
		ownerSpec.SharedRole.Members = append(ownerSpec.SharedRole.Members, fmt.Sprintf("test/team%d/app", i))
	}
	ownerSpec.InlinePolicies = []iamv1alpha1.InlinePolicy{{Name: "read", Document: document("s3:GetObject")}}
	owner := west.iamsa(t, "team", "owner", ownerSpec)
	owner = waitReady(t, west, owner)
	eastApp = waitReady(t, east, eastApp)

	var roleARN string
	t.Run("one role, one owner, each cluster's statement", func(t *testing.T) {
		r := west.role(sharedName)
		if r == nil || r.Path != irsa.SharedPath {
			t.Fatalf("role = %+v, want one at %s", r, irsa.SharedPath)
		}
		roleARN = r.Arn
		tags := tagsOf(r.Tags)
		if tags[irsa.TagSharedRole] != sharedName || !irsa.OwnedBy(tags, testCluster, "team", "owner") {
			t.Errorf("tags = %v, want the shared role's and its owner's", tags)
		}
		if _, ok := r.InlinePolicies["read"]; !ok {
			t.Errorf("the owner's inline policy is not on the role: %v", r.InlinePolicies)
		}
		if owner.Status.RoleARN != roleARN || eastApp.Status.RoleARN != roleARN {
			t.Errorf("roles in status: west %s, east %s; want %s", owner.Status.RoleARN, eastApp.Status.RoleARN, roleARN)
		}
		wantEast := "system:serviceaccount:team:app through oidc.example.com/id/ABC (IRSA)"
		if s := eastApp.Status.SharedRole; s == nil || s.Owner != "test/team/owner" || !slices.Equal(s.TrustedBy, []string{wantEast}) {
			t.Errorf("east's status.sharedRole = %+v, want owner test/team/owner trusted by [%s]", s, wantEast)
		}
		// The owner was Ready before east joined: its status is as of its last reconcile.
		if s := owner.Status.SharedRole; s == nil || s.Owner != "test/team/owner" {
			t.Errorf("the owner's status.sharedRole = %+v", s)
		}
		if len(eastApp.Status.AttachedPolicyArns)+len(eastApp.Status.InlinePolicies) != 0 {
			t.Errorf("a member records permissions it does not write: %+v", eastApp.Status)
		}
		_, _, doc := west.sharedTrust(t)
		for _, want := range []string{
			`"oidc.example.com/id/ABC:sub":"system:serviceaccount:team:app"`,
			`"aws:RequestTag/eks-cluster-name":"other"`, `"aws:RequestTag/kubernetes-namespace":"team"`,
		} {
			if !strings.Contains(doc, want) {
				t.Errorf("trust policy lacks %s: %s", want, doc)
			}
		}
		var assoc bool
		for _, a := range west.emu.State().Associations {
			assoc = assoc || (a.Cluster == eastCluster && a.Namespace == "team" && a.RoleArn == roleARN)
		}
		if !assoc {
			t.Errorf("no association of east's team/app with the shared role: %+v", west.emu.State().Associations)
		}
		sa := &corev1.ServiceAccount{}
		must(t, west.c.Get(ctx, appIn("team"), sa))
		if sa.Annotations[iamv1alpha1.AnnotationRoleARN] != roleARN {
			t.Errorf("the owner's ServiceAccount (IRSA) is annotated %v, want the shared role", sa.Annotations)
		}
	})

	t.Run("the owner's permissions change; its next reconcile sees the members", func(t *testing.T) {
		update(t, west, owner, func(s *iamv1alpha1.IAMServiceAccount) {
			s.Spec.InlinePolicies[0].Document = document("s3:GetObject", "s3:ListBucket")
		})
		owner = waitReady(t, west, owner)
		if !strings.Contains(west.role(sharedName).InlinePolicies["read"], "s3:ListBucket") {
			t.Errorf("inline policy = %s", west.role(sharedName).InlinePolicies["read"])
		}
		if s := owner.Status.SharedRole; s == nil || !slices.Equal(s.TrustedBy, []string{"team/app in EKS cluster other (Pod Identity)"}) {
			t.Errorf("the owner's status.sharedRole = %+v", s)
		}
	})

	t.Run("only the members the owner lists get the role", func(t *testing.T) {
		before, _, _ := west.sharedTrust(t)
		west.namespace(t, "outsider")
		west.serviceAccount(t, "outsider", "app")
		outsider := west.iamsa(t, "outsider", "app", sharedSpec(false, iamv1alpha1.MechanismIRSA))
		outsider = waitCondition(t, west, outsider, ReasonSharedRoleNotListed)
		c := meta.FindStatusCondition(outsider.Status.Conditions, iamv1alpha1.ConditionReady)
		if !strings.Contains(c.Message, "test/outsider/app") || !strings.Contains(c.Message, "owned by test/team/owner") || !strings.Contains(c.Message, "other/team/app") {
			t.Errorf("message = %q, want this member, the owner and the listed members named", c.Message)
		}
		if s := meta.FindStatusCondition(outsider.Status.Conditions, status.Stalled); s == nil || s.Status != "True" {
			t.Errorf("a member its owner does not list is not Stalled: %+v", outsider.Status.Conditions)
		}
		if n, _, doc := west.sharedTrust(t); n != before {
			t.Errorf("an unlisted member's statement reached the trust policy: %s", doc)
		}

		// A namespace the operator does not let use shared roles: refused before any write.
		west.namespace(t, "elsewhere")
		west.serviceAccount(t, "elsewhere", "app")
		elsewhere := west.iamsa(t, "elsewhere", "app", sharedSpec(false, iamv1alpha1.MechanismIRSA))
		elsewhere = waitCondition(t, west, elsewhere, ReasonSharedRoleNotAllowed)
		if c := meta.FindStatusCondition(elsewhere.Status.Conditions, iamv1alpha1.ConditionReady); !strings.Contains(c.Message, "--iam-shared-role-namespaces") || !strings.Contains(c.Message, "team*, outsider") {
			t.Errorf("message = %q, want the flag and its namespaces named", c.Message)
		}

		// The owner lists it: it joins.
		update(t, west, owner, func(s *iamv1alpha1.IAMServiceAccount) {
			s.Spec.SharedRole.Members = append(s.Spec.SharedRole.Members, "test/outsider/app")
		})
		outsider = waitReady(t, west, outsider)
		if n, _, doc := west.sharedTrust(t); n != before+1 {
			t.Errorf("the listed member's statement is not in the trust policy: %s", doc)
		}
		if s := outsider.Status.SharedRole; s == nil || !slices.Contains(s.Members, "test/outsider/app") {
			t.Errorf("status.sharedRole = %+v, want the listed members", s)
		}

		// The owner drops it: the owner's operator takes its statement out at once, whatever the
		// member's operator does (an operator that did not check the list is no way in).
		update(t, west, owner, func(s *iamv1alpha1.IAMServiceAccount) {
			s.Spec.SharedRole.Members = slices.DeleteFunc(s.Spec.SharedRole.Members, func(m string) bool { return m == "test/outsider/app" })
		})
		owner = waitReady(t, west, owner)
		if n, _, doc := west.sharedTrust(t); n != before {
			t.Errorf("the dropped member's statement is still in the trust policy: %s", doc)
		}
		if tags := tagsOf(west.role(sharedName).Tags); slices.Contains(irsa.ListedMembers(tags), "test/outsider/app") {
			t.Errorf("the role still lists the dropped member: %v", tags)
		}
		waitCondition(t, west, outsider, ReasonSharedRoleNotListed)
		for _, o := range []*iamv1alpha1.IAMServiceAccount{outsider, elsewhere} {
			must(t, west.c.Delete(ctx, o))
			west.waitGone(t, o)
		}
		if n, _, doc := west.sharedTrust(t); n != before {
			t.Errorf("after the refused members left: %s", doc)
		}
	})

	// A statement someone wrote by hand stays whatever the members do.
	r := west.role(sharedName)
	doc := strings.Replace(decoded(t, r.AssumeRolePolicyDocument), `"Statement":[`,
		`"Statement":[{"Sid":"BreakGlass","Effect":"Allow","Principal":{"AWS":"arn:aws:iam::000000000000:root"},"Action":"sts:AssumeRole"},`, 1)
	must(t, west.aws.UpdateTrustPolicy(ctx, sharedName, doc))

	t.Run("two operators writing the trust policy at the same moment lose no statement", func(t *testing.T) {
		before := west.emu.Calls("UpdateAssumeRolePolicy")
		// Both first writes wait until the other has arrived: each was merged into a read made
		// before either wrote, so the one IAM applies second drops the other's statement.
		open := west.emu.Gate("UpdateAssumeRolePolicy", 2)
		t.Cleanup(open)
		a := west.iamsa(t, "team2", "app", sharedSpec(false, iamv1alpha1.MechanismIRSA))
		b := east.iamsa(t, "team2", "app", sharedSpec(false, iamv1alpha1.MechanismBoth))
		waitReady(t, west, a)
		waitReady(t, east, b)
		testenv.Eventually(t, "every member's statements in the trust policy", func() (bool, string) {
			n, hand, doc := west.sharedTrust(t)
			return n == 5 && hand, doc // owner IRSA, east PodIdentity, team2 IRSA, east team2 IRSA + PodIdentity
		})
		if n := west.emu.Calls("UpdateAssumeRolePolicy") - before; n < 3 {
			t.Errorf("%d trust writes; the gate's second write dropped a statement, so at least 3 were needed", n)
		}
	})

	t.Run("a member that does not fit IAM's trust policy quota says so", func(t *testing.T) {
		var full *iamv1alpha1.IAMServiceAccount
		for i := 3; i <= 8 && full == nil; i++ {
			ns := fmt.Sprintf("team%d", i)
			west.namespace(t, ns)
			west.serviceAccount(t, ns, "app")
			m := west.iamsa(t, ns, "app", sharedSpec(false, iamv1alpha1.MechanismIRSA))
			testenv.Eventually(t, ns+" Ready or refused", func() (bool, string) {
				must(t, west.c.Get(ctx, appIn(ns), m))
				c := meta.FindStatusCondition(m.Status.Conditions, iamv1alpha1.ConditionReady)
				if c == nil {
					return false, "no Ready condition"
				}
				if c.Reason == ReasonSharedRoleTrustFull {
					full = m
				}
				return c.Reason == ReasonSynced || c.Reason == ReasonSharedRoleTrustFull, c.Reason + ": " + c.Message
			})
		}
		if full == nil {
			t.Fatal("six more IRSA members fitted in a 2,048-character trust policy")
		}
		c := meta.FindStatusCondition(full.Status.Conditions, iamv1alpha1.ConditionReady)
		if !strings.Contains(c.Message, "Role trust policy length") || !strings.Contains(c.Message, "ACLSizePerRole") {
			t.Errorf("message = %q, want IAM's quota named and what to do", c.Message)
		}
		if s := meta.FindStatusCondition(full.Status.Conditions, status.Stalled); s == nil || s.Status != "True" {
			t.Errorf("a member that needs a person is not Stalled: %+v", full.Status.Conditions)
		}
		// The ones that fitted and the refused one leave; nothing else changes.
		for i := 3; i <= 8; i++ {
			m := &iamv1alpha1.IAMServiceAccount{}
			if err := west.c.Get(ctx, appIn(fmt.Sprintf("team%d", i)), m); err == nil {
				must(t, west.c.Delete(ctx, m))
				west.waitGone(t, m)
			}
		}
		if n, hand, doc := west.sharedTrust(t); n != 5 || !hand {
			t.Errorf("after the extra members left: %d members' statements, hand-written kept %v: %s", n, hand, doc)
		}
	})

	t.Run("one owner at a time", func(t *testing.T) {
		update(t, east, eastApp, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.SharedRole.Owner = true })
		eastApp = waitCondition(t, east, eastApp, ReasonConflict)
		if c := meta.FindStatusCondition(eastApp.Status.Conditions, iamv1alpha1.ConditionReady); !strings.Contains(c.Message, "owned by test/team/owner") {
			t.Errorf("message = %q, want the owner named", c.Message)
		}
		update(t, east, eastApp, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.SharedRole.Owner = false })
		eastApp = waitReady(t, east, eastApp)
	})

	t.Run("the owner leaving releases the role to the members still using it", func(t *testing.T) {
		must(t, west.c.Delete(ctx, owner))
		west.waitGone(t, owner)
		r := west.role(sharedName)
		if r == nil {
			t.Fatal("the shared role was deleted while three members use it")
		}
		tags := tagsOf(r.Tags)
		if tags[irsa.TagSharedRole] != sharedName || tags[irsa.TagCluster] != "" {
			t.Errorf("tags = %v, want the shared role's only (released)", tags)
		}
		if _, ok := r.InlinePolicies["read"]; !ok {
			t.Error("the permissions went with the owner; the members still use them")
		}
		if n, hand, doc := west.sharedTrust(t); n != 4 || !hand {
			t.Errorf("after the owner left: %d members' statements (want 4), hand-written %v: %s", n, hand, doc)
		}
		testenv.WaitForEvent(t, west.c, owner, "SharedRoleKept")

		// Only a member the last owner listed may take over a role without owner (namespace
		// outsider and its ServiceAccount are the earlier subtest's).
		usurper := west.iamsa(t, "outsider", "app", sharedSpec(true, iamv1alpha1.MechanismIRSA))
		usurper = waitCondition(t, west, usurper, ReasonSharedRoleNotListed)
		if c := meta.FindStatusCondition(usurper.Status.Conditions, iamv1alpha1.ConditionReady); !strings.Contains(c.Message, "has no owner") || !strings.Contains(c.Message, "test/outsider/app") {
			t.Errorf("message = %q", c.Message)
		}
		if tags := tagsOf(west.role(sharedName).Tags); tags[irsa.TagCluster] != "" {
			t.Errorf("an unlisted owner took the role: %v", tags)
		}
		must(t, west.c.Delete(ctx, usurper))
		west.waitGone(t, usurper)

		// A listed member takes over: its spec becomes the role's permissions and its list the
		// members', once a read a settle time later still names it.
		update(t, east, eastApp, func(s *iamv1alpha1.IAMServiceAccount) {
			s.Spec.SharedRole.Owner = true
			s.Spec.SharedRole.Members = []string{"test/team2/app", "other/team2/app"}
			s.Spec.InlinePolicies = []iamv1alpha1.InlinePolicy{{Name: "list", Document: document("s3:ListBucket")}}
		})
		waitCondition(t, east, eastApp, ReasonSharedRoleTakingOver)
		eastApp = waitReady(t, east, eastApp)
		r = west.role(sharedName)
		if tags := tagsOf(r.Tags); !irsa.OwnedBy(tags, eastCluster, "team", "app") {
			t.Errorf("tags after the take-over = %v", tags)
		}
		if _, old := r.InlinePolicies["read"]; old || len(r.InlinePolicies) != 1 || !slices.Equal(eastApp.Status.InlinePolicies, []string{"list"}) {
			t.Errorf("inline policies after the take-over: %v (status %v), want the new owner's list alone", r.InlinePolicies, eastApp.Status.InlinePolicies)
		}
		if s := eastApp.Status.SharedRole; s == nil || s.Owner != "other/team/app" {
			t.Errorf("status.sharedRole = %+v", s)
		}
	})

	t.Run("the last member out deletes the role", func(t *testing.T) {
		for _, m := range []struct {
			f    *fixture
			ns   string
			want int
		}{{west, "team2", 3}, {east, "team2", 1}} {
			obj := &iamv1alpha1.IAMServiceAccount{}
			must(t, m.f.c.Get(ctx, appIn(m.ns), obj))
			must(t, m.f.c.Delete(ctx, obj))
			m.f.waitGone(t, obj)
			if n, hand, doc := west.sharedTrust(t); n != m.want || !hand {
				t.Errorf("after %s left: %d members' statements (want %d): %s", m.ns, n, m.want, doc)
			}
		}
		// The last member leaves, but a statement written by hand still admits someone: the role
		// stays for it, released, its permissions kept.
		must(t, east.c.Delete(ctx, eastApp))
		east.waitGone(t, eastApp)
		r := west.role(sharedName)
		if r == nil {
			t.Fatal("the last member deleted a role whose trust policy holds a statement written by hand")
		}
		if tags := tagsOf(r.Tags); tags[irsa.TagCluster] != "" || len(r.InlinePolicies) != 1 {
			t.Errorf("kept role: tags %v, inline policies %v; want released with its permissions", tags, r.InlinePolicies)
		}
		if e := testenv.WaitForEvent(t, east.c, eastApp, "SharedRoleKept"); !strings.Contains(e.Note, breakGlass) {
			t.Errorf("Event = %q, want the hand-written statement named", e.Note)
		}

		// Once that statement is gone (the policy left admitting nobody, as the operators leave
		// one), a listed member that takes the role over and leaves deletes it.
		if _, hand, doc := west.sharedTrust(t); !hand || len(trustSids(t, doc)) != 1 {
			t.Fatalf("trust policy of the kept role: %s", doc)
		}
		must(t, west.aws.UpdateTrustPolicy(ctx, sharedName,
			`{"Version":"2012-10-17","Statement":[{"Sid":"QuartermasterNobody","Effect":"Deny","Principal":{"AWS":"*"},"Action":"sts:*"}]}`))
		last := west.iamsa(t, "team2", "app", sharedSpec(true, iamv1alpha1.MechanismIRSA))
		last = waitReady(t, west, last)
		must(t, west.c.Delete(ctx, last))
		west.waitGone(t, last)
		if r := west.role(sharedName); r != nil {
			t.Errorf("the role outlived its last member: %+v", r)
		}
		for _, a := range west.emu.State().Associations {
			if a.RoleArn == roleARN {
				t.Errorf("association left: %+v", a)
			}
		}
	})
}

func decoded(t *testing.T, doc string) string {
	t.Helper()
	if strings.HasPrefix(strings.TrimSpace(doc), "{") {
		return doc
	}
	d, err := url.PathUnescape(doc)
	must(t, err)
	return d
}

// appIn is the key of the object named app (a member's, and its ServiceAccount's) in a namespace.
func appIn(namespace string) client.ObjectKey {
	return client.ObjectKey{Namespace: namespace, Name: "app"}
}
