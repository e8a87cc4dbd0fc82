package iam

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// answerDelay holds each IAM answer back for a while after the emulator has acted on the request,
// so that work is in flight when a manager is stopped, and a stop loses answers of calls that
// took effect (as a killed process does).
type answerDelay struct {
	base  http.RoundTripper
	delay time.Duration
}

func (d answerDelay) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	select {
	case <-time.After(d.delay):
		return resp, nil
	case <-req.Context().Done():
		_ = resp.Body.Close()
		return nil, req.Context().Err()
	}
}

// slowFlakyConfig is an SDK configuration for the emulator whose answers arrive 10 ms late and
// which tries each call only twice (5 ms apart), so injected faults reach the controller often.
func (f *fixture) slowFlakyConfig() aws.Config {
	cfg := iamemulator.SDKConfig(f.url, iamemulator.FixedBackoff(5*time.Millisecond), func(o *retry.StandardOptions) { o.MaxAttempts = 2 })
	cfg.HTTPClient = &http.Client{Transport: answerDelay{base: iamemulator.HTTPClient().Transport, delay: 10 * time.Millisecond}, Timeout: awsiam.AttemptTimeout}
	return cfg
}

// slowFlakyClient is an IAM client over slowFlakyConfig.
func (f *fixture) slowFlakyClient() *awsiam.Client { return awsiam.New(f.slowFlakyConfig()) }

// pollFast waits, checking every 2 ms, until cond holds: it catches the moment work is half done.
func pollFast(t *testing.T, what string, cond func() (bool, string)) string {
	t.Helper()
	return testenv.Poll(t, what, 2*time.Millisecond, cond)
}

// faultsDocument is policy i's document: one bucket each, and an extra action once changed.
func faultsDocument(i int, changed bool) iamv1alpha1.PolicyDocument {
	actions := []string{"s3:GetObject"}
	if changed {
		actions = append(actions, "s3:PutObject")
	}
	return iamv1alpha1.PolicyDocument{Version: "2012-10-17", Statement: []iamv1alpha1.Statement{{
		Effect: "Allow", Action: actions, Resource: iamv1alpha1.Resources{fmt.Sprintf("arn:aws:s3:::bucket-%02d/*", i)},
	}}}
}

const faultsNamespace = "t-faults"

// awsObjectsOf are the emulator's roles and policies of the fault test's namespace: tagged with
// it, or named with its prefix.
func (f *fixture) awsObjectsOf() (roles map[string]iamemulator.RoleState, policies map[string]iamemulator.PolicyState) {
	ns := faultsNamespace
	st := f.emu.State()
	roles, policies = map[string]iamemulator.RoleState{}, map[string]iamemulator.PolicyState{}
	for _, r := range st.Roles {
		if tagsOf(r.Tags)[irsa.TagNamespace] == ns || strings.HasPrefix(r.Name, irsa.RoleName(ns, "")) {
			if _, dup := roles[r.Name]; dup {
				panic("two roles named " + r.Name)
			}
			roles[r.Name] = r
		}
	}
	for _, p := range st.Policies {
		if tagsOf(p.Tags)[irsa.TagNamespace] == ns || strings.HasPrefix(p.Name, irsa.PolicyName(ns, "")) {
			policies[p.Name] = p
		}
	}
	return roles, policies
}

// testFaults: 30% of IAM calls fail while 20 IAMPolicies and 20 IAMServiceAccounts are created,
// partly deleted and changed, and the manager is stopped three times with work in flight. The end
// state must be exactly the desired one.
func testFaults(t *testing.T, f *fixture) {
	ctx := context.Background()
	const n = 20
	ns := faultsNamespace
	f.namespace(t, ns)
	pName := func(i int) string { return fmt.Sprintf("p%02d", i%n) }
	saName := func(i int) string { return fmt.Sprintf("sa%02d", i) }
	for i := range n {
		f.serviceAccount(t, ns, saName(i))
	}

	orig := f.aws
	f.aws = f.slowFlakyClient()
	defer func() {
		f.emu.SetFaults(0, nil)
		f.aws = orig
		f.run(t, f.opts)
	}()
	before := f.emu.State()
	f.emu.SetFaults(0.3, nil)
	f.run(t, f.opts)

	policies := map[string]*iamv1alpha1.IAMPolicy{}
	accounts := map[string]*iamv1alpha1.IAMServiceAccount{}
	for i := range n {
		p := &iamv1alpha1.IAMPolicy{Spec: iamv1alpha1.IAMPolicySpec{Document: faultsDocument(i, false)}}
		p.Namespace, p.Name = ns, pName(i)
		must(t, f.c.Create(ctx, p))
		policies[p.Name] = p
	}
	for i := range n {
		accounts[saName(i)] = f.iamsa(t, ns, saName(i), iamv1alpha1.IAMServiceAccountSpec{
			ServiceAccountName: saName(i), Policies: []string{pName(i), pName(i + 1)},
		})
	}

	// Kill 1: some roles exist.
	at := pollFast(t, "5 roles", func() (bool, string) {
		roles, pols := f.awsObjectsOf()
		return len(roles) >= 5, fmt.Sprintf("%d roles, %d policies", len(roles), len(pols))
	})
	f.stop(t)
	roles, _ := f.awsObjectsOf()
	t.Logf("stop 1 at %s; after it: %d roles", at, len(roles))
	if len(roles) == n {
		t.Errorf("stop 1 came after the work was done")
	}
	f.run(t, f.opts)

	// Kill 2: some roles have both their policies.
	complete := func() (int, string) {
		roles, pols := f.awsObjectsOf()
		full := 0
		for _, r := range roles {
			if len(r.AttachedPolicies) == 2 {
				full++
			}
		}
		return full, fmt.Sprintf("%d roles, %d with both policies, %d policies", len(roles), full, len(pols))
	}
	at = pollFast(t, "8 roles with both policies", func() (bool, string) {
		full, detail := complete()
		return full >= 8, detail
	})
	f.stop(t)
	full, detail := complete()
	t.Logf("stop 2 at %s; after it: %s", at, detail)
	if full == n {
		t.Errorf("stop 2 came after the work was done")
	}
	f.run(t, f.opts)

	// Everything gets Ready under faults.
	for _, p := range policies {
		waitReady(t, f, p)
	}
	for _, sa := range accounts {
		waitReady(t, f, sa)
	}
	t.Logf("all Ready under faults after %d IAM calls (%d faults injected)",
		f.emu.State().Total-before.Total, sumValues(f.emu.State().Faults)-sumValues(before.Faults))

	// Kill 3, during deletions and changes: sa00–sa04 go, and with them p01–p04 (named by them
	// only); p10 goes while sa09 and sa10 still name it, until they are changed not to; p15–p19
	// get a new document.
	deletedSAs, deletedPolicies := []string{}, []string{}
	for i := range 5 {
		must(t, f.c.Delete(ctx, accounts[saName(i)]))
		deletedSAs = append(deletedSAs, saName(i))
		if i > 0 {
			must(t, f.c.Delete(ctx, policies[pName(i)]))
			deletedPolicies = append(deletedPolicies, pName(i))
		}
	}
	must(t, f.c.Delete(ctx, policies[pName(10)]))
	deletedPolicies = append(deletedPolicies, pName(10))
	update(t, f, accounts[saName(9)], func(sa *iamv1alpha1.IAMServiceAccount) { sa.Spec.Policies = []string{pName(9)} })
	update(t, f, accounts[saName(10)], func(sa *iamv1alpha1.IAMServiceAccount) { sa.Spec.Policies = []string{pName(11)} })
	for i := 15; i < n; i++ {
		update(t, f, policies[pName(i)], func(p *iamv1alpha1.IAMPolicy) { p.Spec.Document = faultsDocument(i, true) })
	}
	at = pollFast(t, "2 roles deleted", func() (bool, string) {
		roles, pols := f.awsObjectsOf()
		return len(roles) <= n-2, fmt.Sprintf("%d roles, %d policies", len(roles), len(pols))
	})
	f.stop(t)
	roles, pols := f.awsObjectsOf()
	t.Logf("stop 3 at %s; after it: %d roles, %d policies", at, len(roles), len(pols))
	if len(roles) == n-5 && len(pols) == n-5 {
		t.Errorf("stop 3 came after the deletions were done")
	}
	f.run(t, f.opts)

	// Faults off: the end state.
	f.emu.SetFaults(0, nil)
	for _, name := range deletedSAs {
		f.waitGone(t, accounts[name])
		delete(accounts, name)
	}
	for _, name := range deletedPolicies {
		f.waitGone(t, policies[name])
		delete(policies, name)
	}
	for name, p := range policies {
		policies[name] = waitReady(t, f, p)
	}
	for name, sa := range accounts {
		accounts[name] = waitReady(t, f, sa)
	}

	// AWS holds exactly the desired objects.
	roles, pols = f.awsObjectsOf()
	if len(pols) != len(policies) {
		t.Errorf("%d policies in AWS, want %d: %v", len(pols), len(policies), slices.Sorted(maps.Keys(pols)))
	}
	for name, p := range policies {
		ap, ok := pols[irsa.PolicyName(ns, name)]
		if !ok {
			t.Errorf("policy %s missing in AWS", name)
			continue
		}
		if ap.Arn != p.Status.ARN || ap.Path != irsa.Path(testCluster) || !irsa.OwnedBy(tagsOf(ap.Tags), testCluster, ns, name) {
			t.Errorf("policy %s: ARN %s (status %s), path %s, tags %v", name, ap.Arn, p.Status.ARN, ap.Path, ap.Tags)
		}
		wantVersions := 1 // the changed documents have one more
		if slices.Contains(p.Spec.Document.Statement[0].Action, "s3:PutObject") {
			wantVersions = 2
		}
		var defaults []iamemulator.VersionState
		for _, v := range ap.Versions {
			if v.IsDefault {
				defaults = append(defaults, v)
			}
		}
		spec, err := irsa.PolicyDocumentJSON(p.Spec.Document)
		must(t, err)
		if len(ap.Versions) != wantVersions || len(defaults) != 1 || ap.DefaultVersionID != p.Status.DefaultVersionID {
			t.Errorf("policy %s: %d versions (want %d), default %s (status %s)", name, len(ap.Versions), wantVersions, ap.DefaultVersionID, p.Status.DefaultVersionID)
		} else if same, err := irsa.Equivalent(defaults[0].Document, spec); err != nil || !same {
			t.Errorf("policy %s: default document %s, spec %s", name, defaults[0].Document, spec)
		}
	}
	if len(roles) != len(accounts) {
		t.Errorf("%d roles in AWS, want %d: %v", len(roles), len(accounts), slices.Sorted(maps.Keys(roles)))
	}
	for name, sa := range accounts {
		r, ok := roles[irsa.RoleName(ns, name)]
		if !ok {
			t.Errorf("role of %s missing in AWS", name)
			continue
		}
		var want []string
		for _, pn := range sa.Spec.Policies {
			want = append(want, policies[pn].Status.ARN)
		}
		slices.Sort(want)
		if got := slices.Sorted(slices.Values(r.AttachedPolicies)); !slices.Equal(got, want) || !slices.Equal(sa.Status.AttachedPolicyArns, want) {
			t.Errorf("role of %s: attached %v, status %v, want %v", name, got, sa.Status.AttachedPolicyArns, want)
		}
		if r.Arn != sa.Status.RoleARN || !irsa.OwnedBy(tagsOf(r.Tags), testCluster, ns, name) {
			t.Errorf("role of %s: ARN %s (status %s), tags %v", name, r.Arn, sa.Status.RoleARN, r.Tags)
		}
		k8sSA := &corev1.ServiceAccount{}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, k8sSA))
		if k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN] != r.Arn {
			t.Errorf("ServiceAccount %s annotations %v", name, k8sSA.Annotations)
		}
	}
	for _, name := range deletedSAs {
		k8sSA := &corev1.ServiceAccount{}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, k8sSA))
		if _, ok := k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN]; ok {
			t.Errorf("ServiceAccount %s still annotated: %v", name, k8sSA.Annotations)
		}
	}
	// Nothing under the controller's path lacks its three tags (whoever's test made it).
	st := f.emu.State()
	for _, r := range st.Roles {
		if tags := tagsOf(r.Tags); r.Path == irsa.Path(testCluster) && (tags[irsa.TagCluster] == "" || tags[irsa.TagNamespace] == "" || tags[irsa.TagName] == "") {
			t.Errorf("role %s without the three tags: %v", r.Name, r.Tags)
		}
	}
	for _, p := range st.Policies {
		if tags := tagsOf(p.Tags); p.Path == irsa.Path(testCluster) && (tags[irsa.TagCluster] == "" || tags[irsa.TagNamespace] == "" || tags[irsa.TagName] == "") {
			t.Errorf("policy %s without the three tags: %v", p.Name, p.Tags)
		}
	}

	// No hot loop: quiet once done, and a bounded number of calls overall.
	total := st.Total - before.Total
	time.Sleep(2 * time.Second) // the pause is the point: no IAM call may happen in it
	if quiet := f.emu.State().Total - st.Total; quiet != 0 {
		t.Errorf("%d IAM calls after everything was Ready", quiet)
	}
	// Without faults or stops the work takes about 40 + 20×8 + deletions ≈ 300 calls; each
	// restart reads everything again (≈ 80).
	t.Logf("reconciles interrupted by the stops (logged errors with context canceled): %d", strings.Count(logs.String(), "context canceled"))
	t.Logf("%d IAM calls in all, %d faults injected; by action: %v", total, sumValues(st.Faults)-sumValues(before.Faults), diffCalls(before.Calls, st.Calls))
	if total > 3000 {
		t.Errorf("%d IAM calls: a retry loop?", total)
	}
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
