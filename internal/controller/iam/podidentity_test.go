package iam

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awseks"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// eksOperations are the EKS operations the emulator counts.
var eksOperations = []string{"CreatePodIdentityAssociation", "DescribePodIdentityAssociation", "UpdatePodIdentityAssociation",
	"DeletePodIdentityAssociation", "ListPodIdentityAssociations", "TagResource", "ListTagsForResource"}

// eksCalls is the number of EKS calls in calls (the emulator's per-operation counters).
func eksCalls(calls map[string]int) map[string]int {
	out := map[string]int{}
	for _, op := range eksOperations {
		if calls[op] != 0 {
			out[op] = calls[op]
		}
	}
	return out
}

// associationsOf are the emulator's associations of ServiceAccount ns/sa, in any cluster.
func associationsOf(st iamemulator.State, ns, sa string) []iamemulator.AssociationState {
	var out []iamemulator.AssociationState
	for _, a := range st.Associations {
		if a.Namespace == ns && a.ServiceAccount == sa {
			out = append(out, a)
		}
	}
	return out
}

// trusted says which mechanisms a trust policy admits (none when it does not parse).
func trusted(doc string) irsa.Parts {
	var got struct {
		Statement []struct {
			Principal map[string]any
			Action    any
		}
	}
	if json.Unmarshal([]byte(doc), &got) != nil {
		return irsa.Parts{}
	}
	var p irsa.Parts
	for _, s := range got.Statement {
		if _, ok := s.Principal["Federated"]; ok && fmt.Sprint(s.Action) == "sts:AssumeRoleWithWebIdentity" {
			p.Annotation = true
		}
		if fmt.Sprint(s.Principal["Service"]) == irsa.PodIdentityPrincipal && fmt.Sprint(s.Action) == "[sts:AssumeRole sts:TagSession]" {
			p.Association = true
		}
	}
	return p
}

// assertMechanism checks that the ServiceAccount has exactly the parts mechanism m needs: the
// annotation, one association of ours to the role, a role trusting exactly those mechanisms and
// described by m, and the status naming the association.
func assertMechanism(t *testing.T, f *fixture, sa *iamv1alpha1.IAMServiceAccount, m iamv1alpha1.Mechanism) {
	t.Helper()
	want := irsa.Needs(m)
	st := f.emu.State()
	k8sSA := &corev1.ServiceAccount{}
	must(t, f.c.Get(context.Background(), client.ObjectKey{Namespace: sa.Namespace, Name: sa.Spec.ServiceAccountName}, k8sSA))
	if annotated := k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN] == sa.Status.RoleARN; annotated != want.Annotation {
		t.Errorf("%s: ServiceAccount annotations %v, want annotated=%v", m, k8sSA.Annotations, want.Annotation)
	}
	assocs := associationsOf(st, sa.Namespace, sa.Spec.ServiceAccountName)
	rec := sa.Status.PodIdentityAssociation
	if want.Association {
		if len(assocs) != 1 || rec == nil || assocs[0].ID != rec.AssociationID || assocs[0].Arn != rec.AssociationARN ||
			assocs[0].RoleArn != sa.Status.RoleARN || assocs[0].Cluster != testCluster || !irsa.OwnedBy(assocs[0].Tags, testCluster, sa.Namespace, sa.Name) {
			t.Errorf("%s: associations %+v, status %+v, want one of ours to %s", m, assocs, rec, sa.Status.RoleARN)
		}
	} else if len(assocs) != 0 || rec != nil {
		t.Errorf("%s: associations %+v, status %+v, want none", m, assocs, rec)
	}
	role := f.role(sa.Status.RoleName)
	if role == nil || trusted(role.AssumeRolePolicyDocument) != want {
		t.Errorf("%s: role %+v, want it trusting %v", m, role, want)
	} else if d := irsa.RoleDescription(m, sa.Namespace, sa.Spec.ServiceAccountName); role.Description != d {
		t.Errorf("%s: role description %q, want %q", m, role.Description, d)
	}
}

func setMechanism(t *testing.T, f *fixture, sa *iamv1alpha1.IAMServiceAccount, m iamv1alpha1.Mechanism) *iamv1alpha1.IAMServiceAccount {
	t.Helper()
	update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.Mechanism = m })
	return waitReady(t, f, sa)
}

func testPodIdentity(t *testing.T, f *fixture) {
	ctx := context.Background()
	const ns = "t-podid"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "app")

	sa := f.iamsa(t, ns, "app", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "app", Mechanism: iamv1alpha1.MechanismPodIdentity})
	sa = waitReady(t, f, sa)
	t.Run("PodIdentity: an association of ours to the role, no annotation, a role trusting pods.eks.amazonaws.com", func(t *testing.T) {
		assertMechanism(t, f, sa, iamv1alpha1.MechanismPodIdentity)
		c := meta.FindStatusCondition(sa.Status.Conditions, iamv1alpha1.ConditionReady)
		if !strings.Contains(c.Message, "EKS Pod Identity (association "+sa.Status.PodIdentityAssociation.AssociationID+" in cluster test)") {
			t.Errorf("Ready message %q does not name the association", c.Message)
		}
		var notes []string
		for _, e := range testenv.EventsAbout(t, f.c, sa) {
			notes = append(notes, e.Reason+": "+e.Note)
		}
		if len(notes) != 1 || !strings.Contains(notes[0], "RoleCreated: created IAM role") || !strings.Contains(notes[0], "created EKS Pod Identity association "+sa.Status.PodIdentityAssociation.AssociationID) {
			t.Errorf("Events %q, want one RoleCreated naming the association", notes)
		}
	})

	t.Run("a resync of a Ready object reads three times and writes nothing", func(t *testing.T) {
		rv := sa.ResourceVersion
		r, sent := f.standaloneServiceAccount(t)
		_, err := r.Reconcile(ctx, request(sa))
		must(t, err)
		calls := sent.Calls()
		if want := map[string]int{"GetRole": 1, "ListAttachedRolePolicies": 1, "DescribePodIdentityAssociation": 1}; !maps.Equal(calls, want) {
			t.Errorf("calls = %v, want %v", calls, want)
		}
		must(t, f.c.Get(ctx, client.ObjectKeyFromObject(sa), sa))
		if sa.ResourceVersion != rv {
			t.Error("the IAMServiceAccount was written")
		}
	})

	t.Run("idle: no EKS call between resyncs", func(t *testing.T) {
		before := f.emu.State().Calls
		time.Sleep(2 * time.Second) // the pause is the point: no call may happen in it
		if calls := diffCalls(before, f.emu.State().Calls); len(calls) != 0 {
			t.Errorf("calls while idle: %v", calls)
		}
	})

	t.Run("mechanism changes in every direction", func(t *testing.T) {
		id := sa.Status.PodIdentityAssociation.AssociationID
		for _, m := range []iamv1alpha1.Mechanism{
			iamv1alpha1.MechanismBoth, iamv1alpha1.MechanismIRSA, iamv1alpha1.MechanismPodIdentity,
			iamv1alpha1.MechanismIRSA, iamv1alpha1.MechanismBoth, iamv1alpha1.MechanismPodIdentity,
		} {
			from := sa.Spec.Mechanism
			before := f.emu.State().Calls
			sa = setMechanism(t, f, sa, m)
			assertMechanism(t, f, sa, m)
			calls := diffCalls(before, f.emu.State().Calls)
			// An association that stays is kept, never re-created.
			if irsa.Needs(from).Association && irsa.Needs(m).Association {
				if sa.Status.PodIdentityAssociation.AssociationID != id || calls["CreatePodIdentityAssociation"] != 0 {
					t.Errorf("%s→%s: association %s (was %s), calls %v", from, m, sa.Status.PodIdentityAssociation.AssociationID, id, calls)
				}
			}
			// The description follows the mechanism in one write, and the next resync writes nothing.
			if calls["UpdateRole"] != 1 {
				t.Errorf("%s→%s: %d UpdateRole calls, want 1 (the description)", from, m, calls["UpdateRole"])
			}
			r, sent := f.standaloneServiceAccount(t)
			_, err := r.Reconcile(ctx, request(sa))
			must(t, err)
			if w := writes(sent.Calls()); len(w) != 0 {
				t.Errorf("%s→%s: the resync after the change wrote %v", from, m, w)
			}
			if rec := sa.Status.PodIdentityAssociation; rec != nil {
				id = rec.AssociationID
			}
			t.Logf("%s→%s: %v", from, m, calls)
		}
	})

	t.Run("drift: a deleted association is re-created, a changed role restored", func(t *testing.T) {
		opts := f.opts
		opts.Resync = 2 * time.Second
		f.run(t, opts)
		defer f.run(t, f.opts)
		old := sa.Status.PodIdentityAssociation.AssociationID
		must(t, f.eks.Delete(ctx, testCluster, old))
		testenv.Eventually(t, "a new association", func() (bool, string) {
			a := associationsOf(f.emu.State(), ns, "app")
			return len(a) == 1 && a[0].ID != old && a[0].RoleArn == sa.Status.RoleARN, fmt.Sprint(a)
		})
		current := associationsOf(f.emu.State(), ns, "app")[0].ID
		_, err := f.eks.Update(ctx, &awseks.Association{Cluster: testCluster, ID: current}, "arn:aws:iam::000000000000:role/someone-elses", awseks.Target{})
		must(t, err)
		testenv.Eventually(t, "the role restored", func() (bool, string) {
			a := associationsOf(f.emu.State(), ns, "app")
			return len(a) == 1 && a[0].ID == current && a[0].RoleArn == sa.Status.RoleARN, fmt.Sprint(a)
		})
		testenv.Eventually(t, "the status naming the new association", func() (bool, string) {
			must(t, f.c.Get(ctx, client.ObjectKeyFromObject(sa), sa))
			rec := sa.Status.PodIdentityAssociation
			return rec != nil && rec.AssociationID == current, fmt.Sprint(rec)
		})
	})

	t.Run("--eks-cluster-name moves the association to that cluster", func(t *testing.T) {
		moved := f.opts
		moved.EKSClusterName = otherEKSCluster
		f.run(t, moved)
		testenv.Eventually(t, "the association in the other cluster only", func() (bool, string) {
			a := associationsOf(f.emu.State(), ns, "app")
			return len(a) == 1 && a[0].Cluster == otherEKSCluster, fmt.Sprint(a)
		})
		f.run(t, f.opts)
		testenv.Eventually(t, "the association back in the test cluster", func() (bool, string) {
			a := associationsOf(f.emu.State(), ns, "app")
			return len(a) == 1 && a[0].Cluster == testCluster, fmt.Sprint(a)
		})
		sa = waitReady(t, f, sa)
	})

	t.Run("an association of someone else's ServiceAccount is never touched", func(t *testing.T) {
		theirs, err := f.eks.Create(ctx, awseks.NewAssociation{Cluster: testCluster, Namespace: ns, ServiceAccount: "theirs",
			RoleARN: "arn:aws:iam::000000000000:role/theirs"})
		must(t, err)
		sa = setMechanism(t, f, sa, iamv1alpha1.MechanismIRSA)
		assertMechanism(t, f, sa, iamv1alpha1.MechanismIRSA)
		if a := associationsOf(f.emu.State(), ns, "theirs"); len(a) != 1 || a[0].ID != theirs.ID || a[0].RoleArn != theirs.RoleARN {
			t.Errorf("their association: %+v", a)
		}
		must(t, f.eks.Delete(ctx, testCluster, theirs.ID))
	})

	t.Run("IRSA makes no EKS call", func(t *testing.T) {
		r, sent := f.standaloneServiceAccount(t)
		_, err := r.Reconcile(ctx, request(sa))
		must(t, err)
		if calls := eksCalls(sent.Calls()); len(calls) != 0 {
			t.Errorf("EKS calls of an IRSA object: %v", calls)
		}
	})

	t.Run("deletion removes the association and the role", func(t *testing.T) {
		sa = setMechanism(t, f, sa, iamv1alpha1.MechanismBoth)
		role := sa.Status.RoleName
		must(t, f.c.Delete(ctx, sa))
		f.waitGone(t, sa)
		if a := associationsOf(f.emu.State(), ns, "app"); len(a) != 0 || f.role(role) != nil {
			t.Errorf("left in AWS: associations %+v, role %v", a, f.role(role) != nil)
		}
	})

	t.Run("createServiceAccount with PodIdentity: a ServiceAccount without the annotation", func(t *testing.T) {
		made := waitReady(t, f, f.iamsa(t, ns, "made", iamv1alpha1.IAMServiceAccountSpec{
			ServiceAccountName: "made", CreateServiceAccount: true, Mechanism: iamv1alpha1.MechanismPodIdentity}))
		assertMechanism(t, f, made, iamv1alpha1.MechanismPodIdentity)
		must(t, f.c.Delete(ctx, made))
		f.waitGone(t, made)
	})
}

// testPodIdentityAdoption: an association made without Quartermaster's tags (by eksctl, a script)
// is a Conflict until the object is annotated quartermaster.dev/adopt, then tagged, pointed at the
// role and managed; another Quartermaster object's association is never adopted.
func testPodIdentityAdoption(t *testing.T, f *fixture) {
	ctx := context.Background()
	const ns = "t-podid-adopt"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "legacy")
	old, err := f.eks.Create(ctx, awseks.NewAssociation{Cluster: testCluster, Namespace: ns, ServiceAccount: "legacy",
		RoleARN: "arn:aws:iam::000000000000:role/made-by-eksctl", Tags: map[string]string{"alpha.eksctl.io/cluster-name": "test"}})
	must(t, err)
	sa := f.iamsa(t, ns, "legacy", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "legacy", Mechanism: iamv1alpha1.MechanismPodIdentity})
	t.Cleanup(func() {
		if err := f.c.Delete(ctx, sa); err == nil {
			f.waitGone(t, sa)
		}
	})

	sa = waitCondition(t, f, sa, ReasonConflict)
	assertStalled(t, sa.Status.Conditions, "annotate quartermaster.dev/adopt=true")
	if a := associationsOf(f.emu.State(), ns, "legacy"); len(a) != 1 || a[0].RoleArn != old.RoleARN || irsa.TaggedByQuartermaster(a[0].Tags) {
		t.Errorf("the association was changed without the annotation: %+v", a)
	}

	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, iamv1alpha1.AnnotationAdopt)
	must(t, f.c.Patch(ctx, sa, client.RawPatch(types.MergePatchType, []byte(patch))))
	sa = waitReady(t, f, sa)
	assertMechanism(t, f, sa, iamv1alpha1.MechanismPodIdentity)
	a := associationsOf(f.emu.State(), ns, "legacy")[0]
	if a.ID != old.ID || a.Tags["alpha.eksctl.io/cluster-name"] != "test" {
		t.Errorf("adopted association %+v, want %s with its own tags kept", a, old.ID)
	}
	testenv.WaitForEvent(t, f.c, sa, "Adopted")

	t.Run("another Quartermaster object's association is never adopted", func(t *testing.T) {
		f.serviceAccount(t, ns, "theirs")
		theirs, err := f.eks.Create(ctx, awseks.NewAssociation{Cluster: testCluster, Namespace: ns, ServiceAccount: "theirs",
			RoleARN: "arn:aws:iam::000000000000:role/theirs", Tags: irsa.Tags("another-cluster", ns, "theirs")})
		must(t, err)
		other := f.iamsa(t, ns, "theirs", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "theirs", Mechanism: iamv1alpha1.MechanismPodIdentity})
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, iamv1alpha1.AnnotationAdopt)
		must(t, f.c.Patch(ctx, other, client.RawPatch(types.MergePatchType, []byte(patch))))
		other = waitCondition(t, f, other, ReasonConflict)
		assertStalled(t, other.Status.Conditions, "tagged as another Quartermaster object's")
		must(t, f.c.Delete(ctx, other))
		f.waitGone(t, other)
		if a := associationsOf(f.emu.State(), ns, "theirs"); len(a) != 1 || a[0].ID != theirs.ID || a[0].RoleArn != theirs.RoleARN {
			t.Errorf("deleting the IAMServiceAccount changed an association it does not own: %+v", a)
		}
	})

	t.Run("the adopted association is deleted with the object", func(t *testing.T) {
		must(t, f.c.Delete(ctx, sa))
		f.waitGone(t, sa)
		if a := associationsOf(f.emu.State(), ns, "legacy"); len(a) != 0 {
			t.Errorf("left: %+v", a)
		}
	})
}

// gapObserver watches the ServiceAccounts of a namespace and the emulator while mechanisms
// change, and checks every observation: a ServiceAccount always has a part that works. An
// observation reads the ServiceAccounts (t1), the emulator (t2, one consistent snapshot), and the
// ServiceAccounts again (t3). Within one transition each part changes at most once, so an
// annotation absent at t1 and t3 was absent throughout, and then the association must have been
// there at t2, admitted by the role's trust policy; an annotation present at t1 and t3 was present
// at t2, and the trust policy must admit it; an association present must be admitted.
type gapObserver struct {
	f            *fixture
	ns           string
	observations int
	violations   []string
}

func (g *gapObserver) annotated(ctx context.Context) (map[string]string, error) {
	list := &corev1.ServiceAccountList{}
	if err := g.f.c.List(ctx, list, client.InNamespace(g.ns)); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, sa := range list.Items {
		out[sa.Name] = sa.Annotations[iamv1alpha1.AnnotationRoleARN]
	}
	return out, nil
}

// observe makes one observation of the ServiceAccounts names.
func (g *gapObserver) observe(ctx context.Context, names []string) {
	first, err := g.annotated(ctx)
	if err != nil {
		return // the test's context ended
	}
	st := g.f.emu.State()
	last, err := g.annotated(ctx)
	if err != nil {
		return
	}
	g.observations++
	for _, name := range names {
		roleName := irsa.RoleName(g.ns, name)
		var role *iamemulator.RoleState
		for _, r := range st.Roles {
			if r.Name == roleName {
				role = &r
			}
		}
		if role == nil {
			g.violations = append(g.violations, fmt.Sprintf("observation %d: %s has no role", g.observations, name))
			continue
		}
		trust := trusted(role.AssumeRolePolicyDocument)
		assoc := false
		for _, a := range associationsOf(st, g.ns, name) {
			assoc = assoc || (a.Cluster == testCluster && a.RoleArn == role.Arn)
		}
		ann1, ann3 := first[name] == role.Arn, last[name] == role.Arn
		working := assoc && trust.Association
		switch {
		case !ann1 && !ann3 && !working:
			g.violations = append(g.violations, fmt.Sprintf("observation %d: %s has no annotation, and association=%v with trust %v", g.observations, name, assoc, trust))
		case ann1 && ann3 && !trust.Annotation:
			g.violations = append(g.violations, fmt.Sprintf("observation %d: %s is annotated and the role trusts %v", g.observations, name, trust))
		case assoc && !trust.Association:
			g.violations = append(g.violations, fmt.Sprintf("observation %d: %s has an association and the role trusts %v", g.observations, name, trust))
		}
	}
}

// testPodIdentityFaults: 30% of IAM and EKS calls fail (throttling and 503s) while 6
// IAMServiceAccounts go through every mechanism change, and the manager is stopped once in the
// middle of a migration; at no observed moment does a ServiceAccount lack credentials, and the end
// state is exactly the desired one.
func testPodIdentityFaults(t *testing.T, f *fixture) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns, n = "t-podid-faults", 6
	f.namespace(t, ns)
	var names []string
	accounts := map[string]*iamv1alpha1.IAMServiceAccount{}
	for i := range n {
		name := fmt.Sprintf("sa%d", i)
		names = append(names, name)
		f.serviceAccount(t, ns, name)
		accounts[name] = f.iamsa(t, ns, name, iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: name})
	}
	for name, sa := range accounts {
		accounts[name] = waitReady(t, f, sa)
	}

	origIAM, origEKS := f.aws, f.eks
	f.aws, f.eks = f.slowFlakyClient(), awseks.New(f.slowFlakyConfig())
	before := f.emu.State()
	f.emu.SetFaults(0.3, nil)
	f.run(t, f.opts)
	defer func() {
		f.emu.SetFaults(0, nil)
		f.aws, f.eks = origIAM, origEKS
		f.run(t, f.opts)
	}()

	obs := &gapObserver{f: f, ns: ns}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			obs.observe(ctx, names)
			time.Sleep(2 * time.Millisecond)
		}
	}()

	for _, m := range []iamv1alpha1.Mechanism{
		iamv1alpha1.MechanismBoth, iamv1alpha1.MechanismPodIdentity, iamv1alpha1.MechanismIRSA,
		iamv1alpha1.MechanismPodIdentity, iamv1alpha1.MechanismBoth, iamv1alpha1.MechanismIRSA,
	} {
		for _, sa := range accounts {
			update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) { s.Spec.Mechanism = m })
		}
		if m == iamv1alpha1.MechanismPodIdentity && f.emu.State().Calls["DeletePodIdentityAssociation"] > before.Calls["DeletePodIdentityAssociation"] {
			// IRSA → PodIdentity, the second time: stopped once some associations exist.
			at := pollFast(t, "2 associations", func() (bool, string) {
				k := 0
				for _, name := range names {
					k += len(associationsOf(f.emu.State(), ns, name))
				}
				return k >= 2, fmt.Sprintf("%d associations", k)
			})
			f.stop(t)
			t.Logf("stopped during IRSA→PodIdentity at %s", at)
			f.run(t, f.opts)
		}
		for name, sa := range accounts {
			accounts[name] = waitReady(t, f, sa)
		}
	}
	f.emu.SetFaults(0, nil)
	cancel()
	<-done

	for _, sa := range accounts {
		assertMechanism(t, f, sa, iamv1alpha1.MechanismIRSA)
	}
	st := f.emu.State()
	t.Logf("%d observations; %d calls (EKS: %v), %d faults injected (%v)", obs.observations, st.Total-before.Total,
		eksCalls(diffCalls(before.Calls, st.Calls)), sumValues(st.Faults)-sumValues(before.Faults), eksCalls(diffCalls(before.Faults, st.Faults)))
	if eksFaults := eksCalls(diffCalls(before.Faults, st.Faults)); len(eksFaults) == 0 {
		t.Error("no EKS call was faulted: the test proves nothing")
	}
	if obs.observations < 20 {
		t.Errorf("only %d observations", obs.observations)
	}
	for _, v := range obs.violations {
		t.Error(v)
	}
	for _, sa := range accounts {
		must(t, f.c.Delete(context.Background(), sa))
	}
	for _, sa := range accounts {
		f.waitGone(t, sa)
	}
}
