package iam

import (
	"context"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestIAM runs every envtest case against the package's API server and one IAM emulator, in
// order. Validation runs first, before any manager exists.
func TestIAM(t *testing.T) {
	t.Parallel()
	f := start(t, env)
	t.Run("validation", func(t *testing.T) { testValidation(t, f) })
	// Before the other cases: it counts every AWS call made while it runs.
	t.Run("without --oidc-issuer", func(t *testing.T) { testWithoutIssuer(t, f) })
	f.run(t, f.opts)
	t.Run("policy lifecycle", func(t *testing.T) { testPolicyLifecycle(t, f) })
	t.Run("service account lifecycle", func(t *testing.T) { testServiceAccountLifecycle(t, f) })
	t.Run("created service account", func(t *testing.T) { testCreatedServiceAccount(t, f) })
	t.Run("errors", func(t *testing.T) { testErrors(t, f) })
	t.Run("retain", func(t *testing.T) { testRetain(t, f) })
	t.Run("adoption", func(t *testing.T) { testAdoption(t, f) })
	t.Run("pod identity", func(t *testing.T) { testPodIdentity(t, f) })
	t.Run("pod identity adoption", func(t *testing.T) { testPodIdentityAdoption(t, f) })
	t.Run("terminating namespace", func(t *testing.T) { testTerminatingNamespace(t, f) })
	t.Run("configmap compat", func(t *testing.T) { testCompat(t, f) })
	t.Run("drift", func(t *testing.T) { testDrift(t, f) })
	t.Run("faults", func(t *testing.T) { testFaults(t, f) })
	t.Run("pod identity faults", func(t *testing.T) { testPodIdentityFaults(t, f) })
	t.Run("stale cache", func(t *testing.T) { testStaleCache(t, f) })
	t.Run("inline policies", func(t *testing.T) { testInlinePolicies(t, f) })
	t.Run("cross-account target role", func(t *testing.T) { testTargetRole(t, f) })
	t.Run("unused permissions", func(t *testing.T) { testAccessReport(t, f) })
}

func tagsOf(tags []iamemulator.Tag) map[string]string {
	m := map[string]string{}
	for _, t := range tags {
		m[t.Key] = t.Value
	}
	return m
}

func testPolicyLifecycle(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-policy")
	p := f.policy(t, "t-policy", "read", "s3:GetObject")
	p = waitReady(t, f, p)
	wantARN := "arn:aws:iam::000000000000:policy/quartermaster/test/t-policy-read"
	if p.Status.ARN != wantARN || p.Status.PolicyName != "t-policy-read" || p.Status.PolicyID == "" || p.Status.DefaultVersionID != "v1" {
		t.Fatalf("status = %+v, want ARN %s, version v1", p.Status, wantARN)
	}
	ap := f.awsPolicy(wantARN)
	if ap == nil || ap.Path != "/quartermaster/test/" {
		t.Fatalf("AWS policy = %+v", ap)
	}
	if !irsa.OwnedBy(tagsOf(ap.Tags), testCluster, "t-policy", "read") {
		t.Errorf("tags = %v", ap.Tags)
	}
	testenv.WaitForEvent(t, f.c, p, "PolicyCreated")

	t.Run("a reconcile of an unchanged policy reads twice and writes nothing", func(t *testing.T) {
		r, sent := f.standalonePolicy(t)
		res, err := r.Reconcile(ctx, request(p))
		must(t, err)
		if res.RequeueAfter < 54*time.Minute || res.RequeueAfter > 66*time.Minute {
			t.Errorf("requeue after %v, want the 1h resync ±10%%", res.RequeueAfter)
		}
		calls := sent.Calls()
		if want := map[string]int{"GetPolicy": 1, "GetPolicyVersion": 1}; !maps.Equal(calls, want) {
			t.Errorf("IAM calls = %v, want %v", calls, want)
		}
	})

	t.Run("a changed document becomes a new default version; at most 5 are kept", func(t *testing.T) {
		for i, action := range []string{"s3:PutObject", "s3:ListBucket", "s3:DeleteObject", "s3:GetBucketTagging", "s3:PutBucketTagging", "s3:GetObjectTagging"} {
			update(t, f, p, func(p *iamv1alpha1.IAMPolicy) { p.Spec.Document = document("s3:GetObject", action) })
			p = waitReady(t, f, p)
			want := "v" + string(rune('2'+i))
			if p.Status.DefaultVersionID != want {
				t.Fatalf("default version %s, want %s", p.Status.DefaultVersionID, want)
			}
		}
		ap := f.awsPolicy(wantARN)
		if len(ap.Versions) != 5 {
			t.Fatalf("%d versions, want 5", len(ap.Versions))
		}
		var ids []string
		for _, v := range ap.Versions {
			ids = append(ids, v.ID)
			if v.IsDefault && !strings.Contains(v.Document, "s3:GetObjectTagging") {
				t.Errorf("default document %s", v.Document)
			}
		}
		slices.Sort(ids)
		if strings.Join(ids, ",") != "v3,v4,v5,v6,v7" {
			t.Errorf("versions %v, want the 5 newest", ids)
		}
	})

	t.Run("a document that means the same causes no write", func(t *testing.T) {
		before := f.emu.State().Calls
		// The same actions in another order: IAM compares them as a set.
		update(t, f, p, func(p *iamv1alpha1.IAMPolicy) { p.Spec.Document = document("s3:GetObjectTagging", "s3:GetObject") })
		p = waitReady(t, f, p)
		calls := diffCalls(before, f.emu.State().Calls)
		if calls["CreatePolicyVersion"] != 0 || calls["GetPolicy"] == 0 {
			t.Errorf("IAM calls = %v, want reads only", calls)
		}
	})

	t.Run("deletion removes the policy and its versions", func(t *testing.T) {
		must(t, f.c.Delete(ctx, p))
		f.waitGone(t, p)
		if ap := f.awsPolicy(wantARN); ap != nil {
			t.Errorf("policy still in AWS: %+v", ap)
		}
	})
}

func testServiceAccountLifecycle(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := "t-sa"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "app")
	read := f.policy(t, ns, "read", "s3:GetObject")
	write := f.policy(t, ns, "write", "s3:PutObject")
	managed := "arn:aws:iam::aws:policy/ReadOnlyAccess"
	sa := f.iamsa(t, ns, "app", iamv1alpha1.IAMServiceAccountSpec{
		ServiceAccountName: "app", Policies: []string{"read", "write"}, ManagedPolicyArns: []string{managed},
	})
	sa = waitReady(t, f, sa)
	read, write = waitReady(t, f, read), waitReady(t, f, write)
	roleName := "eks-sa-t-sa-app"
	wantRole := "arn:aws:iam::000000000000:role/quartermaster/test/" + roleName
	want := []string{managed, read.Status.ARN, write.Status.ARN}
	slices.Sort(want)
	if sa.Status.RoleARN != wantRole || sa.Status.RoleName != roleName || !slices.Equal(sa.Status.AttachedPolicyArns, want) {
		t.Fatalf("status = %+v", sa.Status)
	}
	role := f.role(roleName)
	if role == nil {
		t.Fatal("no role in AWS")
	}
	gotAttached := slices.Sorted(slices.Values(role.AttachedPolicies))
	if !slices.Equal(gotAttached, want) || role.Path != "/quartermaster/test/" || role.MaxSessionDuration != 3600 {
		t.Errorf("role = %+v", role)
	}
	if !irsa.OwnedBy(tagsOf(role.Tags), testCluster, ns, "app") {
		t.Errorf("role tags = %v", role.Tags)
	}
	assertTrust(t, role.AssumeRolePolicyDocument, ns, "app")
	k8sSA := &corev1.ServiceAccount{}
	must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "app"}, k8sSA))
	if k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN] != wantRole {
		t.Errorf("ServiceAccount annotations = %v", k8sSA.Annotations)
	}

	t.Run("one Event says what the creation did", func(t *testing.T) {
		var reasons []string
		for _, e := range testenv.EventsAbout(t, f.c, sa) {
			reasons = append(reasons, e.Reason)
			if e.Reason == "RoleCreated" {
				for _, part := range []string{"created IAM role " + wantRole, "attached ", "annotated ServiceAccount app"} {
					if !strings.Contains(e.Note, part) {
						t.Errorf("RoleCreated note %q lacks %q", e.Note, part)
					}
				}
			}
		}
		if slices.Sort(reasons); !slices.Equal(reasons, []string{"RoleCreated"}) && !slices.Equal(reasons, []string{ReasonPolicyNotReady, "RoleCreated", "RoleUpdated"}) {
			t.Errorf("Events %v, want RoleCreated alone (or with PolicyNotReady and RoleUpdated when the policies came later)", reasons)
		}
	})

	t.Run("a reconcile of an unchanged role reads twice and writes nothing", func(t *testing.T) {
		r, sent := f.standaloneServiceAccount(t)
		_, err := r.Reconcile(ctx, request(sa))
		must(t, err)
		calls := sent.Calls()
		if want := map[string]int{"GetRole": 1, "ListAttachedRolePolicies": 1}; !maps.Equal(calls, want) {
			t.Errorf("IAM calls = %v, want %v", calls, want)
		}
	})

	t.Run("only the difference is attached and detached", func(t *testing.T) {
		before := f.emu.State().Calls
		update(t, f, sa, func(s *iamv1alpha1.IAMServiceAccount) {
			s.Spec.Policies = []string{"read"}
			s.Spec.MaxSessionDuration = new(int32)
			*s.Spec.MaxSessionDuration = 7200
		})
		sa = waitReady(t, f, sa)
		calls := diffCalls(before, f.emu.State().Calls)
		if calls["DetachRolePolicy"] != 1 || calls["AttachRolePolicy"] != 0 || calls["UpdateRole"] != 1 {
			t.Errorf("IAM calls = %v, want one detach and one UpdateRole", calls)
		}
		if r := f.role(roleName); len(r.AttachedPolicies) != 2 || r.MaxSessionDuration != 7200 {
			t.Errorf("role = %+v", r)
		}
	})

	t.Run("a policy in use is not deleted from AWS", func(t *testing.T) {
		must(t, f.c.Delete(ctx, read))
		read = waitCondition(t, f, read, ReasonInUse)
		if f.awsPolicy(read.Status.ARN) == nil {
			t.Fatal("policy deleted while in use")
		}
		if c := meta.FindStatusCondition(read.Status.Conditions, iamv1alpha1.ConditionReady); !strings.Contains(c.Message, "IAMServiceAccount app") {
			t.Errorf("message %q does not name the user", c.Message)
		}
	})

	t.Run("deletion removes the role, the annotation, then the policy", func(t *testing.T) {
		must(t, f.c.Delete(ctx, sa))
		f.waitGone(t, sa)
		if f.role(roleName) != nil {
			t.Error("role still in AWS")
		}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "app"}, k8sSA))
		if _, ok := k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN]; ok {
			t.Errorf("annotation left: %v", k8sSA.Annotations)
		}
		f.waitGone(t, read) // unblocked by the IAMServiceAccount's deletion
		if f.awsPolicy(read.Status.ARN) != nil {
			t.Error("policy still in AWS")
		}
		must(t, f.c.Delete(ctx, write))
		f.waitGone(t, write)
	})
}

func testCreatedServiceAccount(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := "t-created"
	f.namespace(t, ns)
	sa := f.iamsa(t, ns, "builder", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "builder", CreateServiceAccount: true})
	sa = waitReady(t, f, sa)
	k8sSA := &corev1.ServiceAccount{}
	must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "builder"}, k8sSA))
	if !metav1.IsControlledBy(k8sSA, sa) || k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN] != sa.Status.RoleARN {
		t.Errorf("ServiceAccount = %+v", k8sSA.ObjectMeta)
	}

	t.Run("a ServiceAccount someone else made is not taken over", func(t *testing.T) {
		f.serviceAccount(t, ns, "theirs")
		other := f.iamsa(t, ns, "theirs", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "theirs", CreateServiceAccount: true})
		waitCondition(t, f, other, ReasonServiceAccountConflict)
		must(t, f.c.Delete(ctx, other))
		f.waitGone(t, other)
	})
	must(t, f.c.Delete(ctx, sa))
	f.waitGone(t, sa)
	if f.role(sa.Status.RoleName) != nil {
		t.Error("role still in AWS")
	}
}

func testErrors(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := "t-errors"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "app")

	t.Run("a managed policy outside --allowed-policy-arns", func(t *testing.T) {
		sa := f.iamsa(t, ns, "denied", iamv1alpha1.IAMServiceAccountSpec{
			ServiceAccountName: "app", ManagedPolicyArns: []string{"arn:aws:iam::aws:policy/AdministratorAccess"},
		})
		sa = waitCondition(t, f, sa, ReasonPolicyNotAllowed)
		assertStalled(t, sa.Status.Conditions, "arn:aws:iam::aws:policy/AdministratorAccess")
		// The role is kept right, without the refused policy.
		if r := f.role("eks-sa-t-errors-app"); r == nil || len(r.AttachedPolicies) != 0 {
			t.Errorf("role = %+v, want it without the refused policy", r)
		}
		testenv.WaitForEvent(t, f.c, sa, ReasonPolicyNotAllowed)
		must(t, f.c.Delete(ctx, sa))
		f.waitGone(t, sa)
	})

	t.Run("a managed policy the operator stops allowing is detached", func(t *testing.T) {
		readOnly := "arn:aws:iam::aws:policy/ReadOnlyAccess"
		sa := waitReady(t, f, f.iamsa(t, ns, "narrowed", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "app", ManagedPolicyArns: []string{readOnly}}))
		narrowed := f.opts
		narrowed.AllowedPolicyARNs = ""
		f.run(t, narrowed) // a restart reconciles every object
		sa = waitCondition(t, f, sa, ReasonPolicyNotAllowed)
		if r := f.role(sa.Status.RoleName); r == nil || slices.Contains(r.AttachedPolicies, readOnly) {
			t.Errorf("role = %+v, want %s detached", r, readOnly)
		}
		f.run(t, f.opts)
		waitReady(t, f, sa)
		must(t, f.c.Delete(ctx, sa))
		f.waitGone(t, sa)
	})

	t.Run("a missing managed policy is NoSuchEntity, retried slowly", func(t *testing.T) {
		sa := f.iamsa(t, ns, "missing", iamv1alpha1.IAMServiceAccountSpec{
			ServiceAccountName: "app", ManagedPolicyArns: []string{"arn:aws:iam::000000000000:policy/shared/nope"},
		})
		sa = waitCondition(t, f, sa, "NoSuchEntity")
		assertStalled(t, sa.Status.Conditions, "nope")
		testenv.WaitForEvent(t, f.c, sa, "NoSuchEntity")
		// Retried every SlowRetry (1 s here), not in a hot loop.
		before := f.emu.Calls("AttachRolePolicy")
		time.Sleep(2500 * time.Millisecond)
		if n := f.emu.Calls("AttachRolePolicy") - before; n > 4 {
			t.Errorf("%d attach attempts in 2.5 s with a 1 s slow retry", n)
		}
		must(t, f.c.Delete(ctx, sa))
		f.waitGone(t, sa)
		if f.role("eks-sa-t-errors-app") != nil {
			t.Error("role left in AWS")
		}
	})

	t.Run("a document over IAM's size quota is LimitExceeded", func(t *testing.T) {
		var actions []string
		for i := range 200 {
			actions = append(actions, "s3:GetObjectVersionForReplicationNumber"+strings.Repeat("x", i%10)+string(rune('a'+i%26)))
		}
		doc := iamv1alpha1.PolicyDocument{Version: "2012-10-17"}
		for range 2 {
			doc.Statement = append(doc.Statement, iamv1alpha1.Statement{Effect: "Allow", Action: actions, Resource: iamv1alpha1.Resources{"*"}})
		}
		p := &iamv1alpha1.IAMPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "huge"}, Spec: iamv1alpha1.IAMPolicySpec{Document: doc}}
		must(t, f.c.Create(ctx, p))
		p = waitCondition(t, f, p, "LimitExceeded")
		assertStalled(t, p.Status.Conditions, "LimitExceeded")
		// Fixed by the user: it recovers by itself.
		update(t, f, p, func(p *iamv1alpha1.IAMPolicy) { p.Spec.Document = document("s3:GetObject") })
		p = waitReady(t, f, p)
		must(t, f.c.Delete(ctx, p))
		f.waitGone(t, p)
	})

	t.Run("a document IAM refuses is MalformedPolicyDocument, and recovers when fixed", func(t *testing.T) {
		doc := document("s3:GetObject")
		// The API server checks the operators; IAM checks that condition keys carry a vendor prefix.
		doc.Statement[0].Condition = map[string]iamv1alpha1.ConditionValues{"StringEquals": {"SourceIp": {"10.0.0.1"}}}
		p := &iamv1alpha1.IAMPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "malformed"}, Spec: iamv1alpha1.IAMPolicySpec{Document: doc}}
		must(t, f.c.Create(ctx, p))
		p = waitCondition(t, f, p, "MalformedPolicyDocument")
		assertStalled(t, p.Status.Conditions, "must be prefaced by a vendor")
		testenv.WaitForEvent(t, f.c, p, "MalformedPolicyDocument")
		update(t, f, p, func(p *iamv1alpha1.IAMPolicy) {
			p.Spec.Document.Statement[0].Condition = map[string]iamv1alpha1.ConditionValues{"StringEquals": {"aws:SourceIp": {"10.0.0.1"}}}
		})
		p = waitReady(t, f, p)
		must(t, f.c.Delete(ctx, p))
		f.waitGone(t, p)
	})

	t.Run("throttling and 5xx are AWSUnavailable, backed off, and recover", func(t *testing.T) {
		f.emu.SetFaults(1, nil)
		p := f.policy(t, ns, "unlucky", "s3:GetObject")
		p = waitCondition(t, f, p, ReasonAWSUnavailable)
		if !meta.IsStatusConditionTrue(p.Status.Conditions, iamv1alpha1.ConditionReconciling) {
			t.Errorf("conditions %+v, want Reconciling", p.Status.Conditions)
		}
		f.emu.SetFaults(0, nil)
		p = waitReady(t, f, p)
		must(t, f.c.Delete(ctx, p))
		f.waitGone(t, p)
	})

	t.Run("a role name taken by an untagged role is a Conflict and left alone", func(t *testing.T) {
		f.serviceAccount(t, ns, "taken")
		_, err := f.aws.CreateRole(ctx, awsNewRole("eks-sa-t-errors-taken"))
		must(t, err)
		sa := f.iamsa(t, ns, "taken", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "taken"})
		sa = waitCondition(t, f, sa, ReasonConflict)
		assertStalled(t, sa.Status.Conditions, "without Quartermaster's tags")
		must(t, f.c.Delete(ctx, sa))
		f.waitGone(t, sa)
		if f.role("eks-sa-t-errors-taken") == nil {
			t.Error("deleting the IAMServiceAccount deleted a role it did not own")
		}
	})

	t.Run("a missing ServiceAccount is waited for", func(t *testing.T) {
		before := f.emu.TotalCalls()
		sa := f.iamsa(t, ns, "later", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "later"})
		waitCondition(t, f, sa, ReasonServiceAccountNotFound)
		time.Sleep(time.Second) // two 500 ms waits of the test's WaitRetry
		if n := f.emu.TotalCalls() - before; n != 0 {
			t.Errorf("%d IAM calls while waiting for the ServiceAccount, want 0", n)
		}
		f.serviceAccount(t, ns, "later")
		sa = waitReady(t, f, sa)
		must(t, f.c.Delete(ctx, sa))
		f.waitGone(t, sa)
	})

	t.Run("a policy not yet in AWS is waited for", func(t *testing.T) {
		sa := f.iamsa(t, ns, "early", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "app", Policies: []string{"later"}})
		waitCondition(t, f, sa, ReasonPolicyNotReady)
		p := f.policy(t, ns, "later", "sqs:SendMessage")
		p = waitReady(t, f, p)
		sa = waitReady(t, f, sa)
		if !slices.Contains(sa.Status.AttachedPolicyArns, p.Status.ARN) {
			t.Errorf("attached %v, want %s", sa.Status.AttachedPolicyArns, p.Status.ARN)
		}
		must(t, f.c.Delete(ctx, sa))
		must(t, f.c.Delete(ctx, p))
		f.waitGone(t, sa)
		f.waitGone(t, p)
	})
}

func testRetain(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := "t-retain"
	f.namespace(t, ns)
	retain := map[string]string{iamv1alpha1.AnnotationDeletionPolicy: iamv1alpha1.DeletionPolicyRetain}
	p := &iamv1alpha1.IAMPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kept", Annotations: retain},
		Spec: iamv1alpha1.IAMPolicySpec{Document: document("s3:GetObject")}}
	must(t, f.c.Create(ctx, p))
	sa := &iamv1alpha1.IAMServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kept", Annotations: retain},
		Spec: iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "kept", CreateServiceAccount: true, Policies: []string{"kept"}}}
	must(t, f.c.Create(ctx, sa))
	p, sa = waitReady(t, f, p), waitReady(t, f, sa)
	must(t, f.c.Delete(ctx, sa))
	f.waitGone(t, sa)
	must(t, f.c.Delete(ctx, p))
	f.waitGone(t, p)
	if f.role(sa.Status.RoleName) == nil || f.awsPolicy(p.Status.ARN) == nil {
		t.Error("retained AWS objects were deleted")
	}
	// The created ServiceAccount keeps its annotation and is no longer owned, so garbage
	// collection leaves it (envtest has none: the ownerReference is what is checked).
	k8sSA := &corev1.ServiceAccount{}
	must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kept"}, k8sSA))
	if len(k8sSA.OwnerReferences) != 0 || k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN] != sa.Status.RoleARN {
		t.Errorf("retained ServiceAccount = %+v", k8sSA.ObjectMeta)
	}
}

func testDrift(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := "t-drift"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "app")
	// A manager with a short resync, so the repairs happen within the test.
	opts := f.opts
	opts.Resync = 2 * time.Second
	f.run(t, opts)
	defer f.run(t, f.opts)
	p := waitReady(t, f, f.policy(t, ns, "read", "s3:GetObject"))
	sa := waitReady(t, f, f.iamsa(t, ns, "app", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "app", Policies: []string{"read"}}))
	role := sa.Status.RoleName

	t.Run("a detached policy is re-attached", func(t *testing.T) {
		must(t, f.aws.DetachPolicy(ctx, role, p.Status.ARN))
		testenv.Eventually(t, "re-attachment", func() (bool, string) {
			r := f.role(role)
			return r != nil && slices.Contains(r.AttachedPolicies, p.Status.ARN), ""
		})
	})
	t.Run("an edited document is restored", func(t *testing.T) {
		_, err := f.aws.CreatePolicyVersion(ctx, p.Status.ARN, `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}`)
		must(t, err)
		testenv.Eventually(t, "the document restored", func() (bool, string) {
			for _, v := range f.awsPolicy(p.Status.ARN).Versions {
				if v.IsDefault {
					return strings.Contains(v.Document, "s3:GetObject"), v.Document
				}
			}
			return false, "no default"
		})
	})
	t.Run("an edited trust policy is restored", func(t *testing.T) {
		must(t, f.aws.UpdateTrustPolicy(ctx, role, `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"*"},"Action":"sts:AssumeRole"}]}`))
		testenv.Eventually(t, "the trust policy restored", func() (bool, string) {
			d := f.role(role).AssumeRolePolicyDocument
			return strings.Contains(d, "AssumeRoleWithWebIdentity"), d
		})
	})
	t.Run("an edited description is restored", func(t *testing.T) {
		must(t, f.aws.UpdateRole(ctx, role, "edited by hand", 3600))
		testenv.Eventually(t, "the description restored", func() (bool, string) {
			d := f.role(role).Description
			return d == irsa.RoleDescription(iamv1alpha1.MechanismIRSA, ns, "app"), d
		})
	})
	t.Run("a deleted role is re-created", func(t *testing.T) {
		// Someone deletes the role: IAM wants its policies detached first, and a reconcile between
		// the two (the last step's, late on a busy machine) would attach them again and the
		// deletion be refused DeleteConflict. The controller's attachments wait until the role
		// is gone, as they would behind a slower deleter.
		open := f.emu.Gate("AttachRolePolicy", math.MaxInt)
		for _, arn := range f.role(role).AttachedPolicies {
			must(t, f.aws.DetachPolicy(ctx, role, arn))
		}
		must(t, f.aws.DeleteRole(ctx, role))
		open()
		testenv.Eventually(t, "the role re-created", func() (bool, string) {
			r := f.role(role)
			return r != nil && slices.Contains(r.AttachedPolicies, p.Status.ARN), ""
		})
	})
	t.Run("a removed annotation is restored", func(t *testing.T) {
		k8sSA := &corev1.ServiceAccount{}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "app"}, k8sSA))
		orig := k8sSA.DeepCopy()
		delete(k8sSA.Annotations, iamv1alpha1.AnnotationRoleARN)
		must(t, f.c.Patch(ctx, k8sSA, client.MergeFrom(orig)))
		testenv.Eventually(t, "the annotation restored", func() (bool, string) {
			must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "app"}, k8sSA))
			return k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN] == sa.Status.RoleARN, ""
		})
	})
	must(t, f.c.Delete(ctx, sa))
	must(t, f.c.Delete(ctx, p))
	f.waitGone(t, sa)
	f.waitGone(t, p)
}

// assertTrust checks the trust policy federates the issuer for exactly the ServiceAccount.
func assertTrust(t *testing.T, doc, ns, sa string) {
	t.Helper()
	var got struct {
		Statement []struct {
			Effect    string
			Principal map[string]string
			Action    string
			Condition map[string]map[string]string
		}
	}
	must(t, json.Unmarshal([]byte(doc), &got))
	if len(got.Statement) != 1 {
		t.Fatalf("trust policy %s", doc)
	}
	s := got.Statement[0]
	eq := s.Condition["StringEquals"]
	if s.Effect != "Allow" || s.Action != "sts:AssumeRoleWithWebIdentity" ||
		s.Principal["Federated"] != "arn:aws:iam::000000000000:oidc-provider/oidc.example.com/id/ABC" ||
		eq["oidc.example.com/id/ABC:sub"] != "system:serviceaccount:"+ns+":"+sa || eq["oidc.example.com/id/ABC:aud"] != "sts.amazonaws.com" {
		t.Errorf("trust policy %s", doc)
	}
}

func assertStalled(t *testing.T, conds []metav1.Condition, msg string) {
	t.Helper()
	ready := meta.FindStatusCondition(conds, iamv1alpha1.ConditionReady)
	if !meta.IsStatusConditionTrue(conds, iamv1alpha1.ConditionStalled) || meta.IsStatusConditionTrue(conds, iamv1alpha1.ConditionReconciling) ||
		ready == nil || !strings.Contains(ready.Message, msg) {
		t.Errorf("conditions %+v, want Stalled with %q", conds, msg)
	}
}
