package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awseks"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/iam"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const (
	iamServiceAccounts = 500
	iamPoliciesPerSA   = 2
	iamPolicies        = iamServiceAccounts * iamPoliciesPerSA
	// iamNamespaces spread the objects as tenants would: 50 ServiceAccounts and 100 policies each.
	iamNamespaces = 10
	iamWriters    = 16
)

var iamIdle = flag.Duration("iam-idle", 5*time.Minute,
	"iam case: how long to count IAM calls and API requests while nothing changes (the default --iam-resync of 1h does not fall in it)")

// iamBench runs the iam controller in-process against an in-process IAM emulator: 1000
// IAMPolicies and 500 IAMServiceAccounts (two policies each) from creation to all Ready, with the
// IAM calls and API requests they took; the calls of an idle period; and the same objects with
// --iam-concurrency 1 for comparison.
func iamBench(ctx context.Context, e *env) ([]result, error) {
	c, err := iamCRDs(ctx, e)
	if err != nil {
		return nil, err
	}
	emu, api, stop := startIAMEmulator()
	defer stop()

	var out []result
	var base float64
	for _, concurrency := range []int{8, 1} {
		fig, err := iamRun(ctx, e.cluster.Config, c, emu, api, irsaWorkload(concurrency), concurrency, concurrency == 8)
		if err != nil {
			return nil, fmt.Errorf("--iam-concurrency %d: %w", concurrency, err)
		}
		secs := fig.ready.Seconds()
		if concurrency != 8 {
			out = append(out, result{
				metric: fmt.Sprintf("same objects, --iam-concurrency %d: seconds to all Ready", concurrency),
				value:  secs, unit: "s", note: fmt.Sprintf("%.2fx the time of --iam-concurrency 8", secs/base),
			})
			continue
		}
		base = secs
		objects := float64(iamPolicies + iamServiceAccounts)
		out = append(out,
			result{metric: fmt.Sprintf("%d IAMPolicies + %d IAMServiceAccounts (%d policies each) at once, --iam-concurrency 8: seconds to all Ready",
				iamPolicies, iamServiceAccounts, iamPoliciesPerSA), value: secs, unit: "s",
				note: fmt.Sprintf("%.0f objects/s", objects/secs)},
			result{metric: "IAM calls per IAMServiceAccount with its 2 IAMPolicies", value: float64(fig.awsCalls) / iamServiceAccounts, unit: "calls",
				note: fmt.Sprintf("%d calls: %s", fig.awsCalls, actionSummary(fig.awsByAction))},
			result{metric: "IAM calls per object", value: float64(fig.awsCalls) / objects, unit: "calls"},
		)
		out = append(out, restAndDeletion(fig, objects, "IAM", "role and policy")...)
	}
	return out, nil
}

// iamPodIdentityBench runs the iam controller as iamBench does on 500 IAMServiceAccounts with
// mechanism PodIdentity (a role trusting pods.eks.amazonaws.com and an association each, no
// policies), against its simplest peer: a script making the two AWS writes per ServiceAccount
// (CreateRole, CreatePodIdentityAssociation) 8 at a time, on an emulator of its own.
func iamPodIdentityBench(ctx context.Context, e *env) ([]result, error) {
	c, err := iamCRDs(ctx, e)
	if err != nil {
		return nil, err
	}
	emu, api, stop := startIAMEmulator()
	defer stop()
	const concurrency = 8
	fig, err := iamRun(ctx, e.cluster.Config, c, emu, api, podIdentityWorkload(), concurrency, true)
	if err != nil {
		return nil, err
	}
	peer, err := podIdentityScript(ctx, concurrency)
	if err != nil {
		return nil, fmt.Errorf("the script: %w", err)
	}
	secs := fig.ready.Seconds()
	out := []result{
		{metric: fmt.Sprintf("script: CreateRole + CreatePodIdentityAssociation for %d ServiceAccounts, %d at a time", iamServiceAccounts, concurrency),
			value: peer.Seconds(), unit: "s", note: "the simplest peer: no reads, no status, no Kubernetes"},
		{metric: fmt.Sprintf("%d IAMServiceAccounts with mechanism PodIdentity at once, --iam-concurrency %d: seconds to all Ready", iamServiceAccounts, concurrency),
			value: secs, unit: "s", note: fmt.Sprintf("%.2fx the script; %.0f objects/s", secs/peer.Seconds(), iamServiceAccounts/secs)},
		{metric: "AWS calls (IAM + EKS) per PodIdentity IAMServiceAccount", value: float64(fig.awsCalls) / iamServiceAccounts, unit: "calls",
			note: fmt.Sprintf("the script makes 2; %d calls: %s", fig.awsCalls, actionSummary(fig.awsByAction))},
	}
	return append(out, restAndDeletion(fig, iamServiceAccounts, "AWS", "role and association")...), nil
}

// restAndDeletion are the figures both iam cases report alike: API requests per object, calls to
// AWS (of the services the case's objects use, named by calls) while nothing changes (must be 0),
// and the namespaces' deletion until AWS holds none of what the objects made.
func restAndDeletion(fig iamFigures, objects float64, calls, made string) []result {
	return []result{
		{metric: "API requests per object (reads + writes)", value: float64(fig.apiTotal) / objects, unit: "requests",
			note: "ServiceAccounts are read uncached"},
		{metric: "API writes per object", value: float64(fig.apiWrites) / objects, unit: "requests",
			note: actionSummary(fig.writesBy)},
		{metric: fmt.Sprintf("%s calls during %s idle (must be 0 between resyncs)", calls, fig.idle), value: float64(fig.idleAWS), unit: "calls",
			note: "--iam-resync 1h (jittered by 10%)"},
		{metric: fmt.Sprintf("API requests during %s idle", fig.idle), value: float64(fig.idleAPI), unit: "requests",
			note: "watches reconnecting only"},
		{metric: fmt.Sprintf("namespace deletion: seconds until every %s is gone from AWS", made), value: fig.deleted.Seconds(), unit: "s",
			note: fmt.Sprintf("%d namespaces; %d %s calls; %d Events or writes refused in terminating namespaces", iamNamespaces, fig.deleteCalls, calls, fig.refused)},
	}
}

// iamCRDs installs the iam CRDs and returns a client that knows their kinds.
func iamCRDs(ctx context.Context, e *env) (client.Client, error) {
	c, err := client.New(e.cluster.Config, client.Options{Scheme: manager.Scheme(iamv1alpha1.AddToScheme)})
	if err != nil {
		return nil, err
	}
	for _, crd := range []string{"iampolicies", "iamserviceaccounts"} {
		path := filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "iam.quartermaster.dev_"+crd+".yaml")
		if _, err := e.cluster.Kubectl(ctx, "apply", "--server-side", "-f", path); err != nil {
			return nil, err
		}
	}
	if err := waitEstablished(ctx, e); err != nil {
		return nil, err
	}
	return c, nil
}

// iamBenchCluster is the --cluster-name of the benchmark's manager, and the EKS cluster (the
// default --eks-cluster-name) its emulator serves.
const iamBenchCluster = "bench"

// startIAMEmulator serves an IAM emulator (IAM, STS, and EKS for iamBenchCluster) on loopback and
// returns it with the controller's clients of it; stop ends it.
func startIAMEmulator() (*iamemulator.Server, awsClients, func()) {
	emu := iamemulator.New(iamemulator.Options{Seed: 1, EKSClusters: []string{iamBenchCluster}})
	srv := httptest.NewServer(emu)
	awsCfg := iamemulator.SDKConfig(srv.URL)
	return emu, awsClients{iam: awsiam.New(awsCfg), eks: awseks.New(awsCfg)}, srv.Close
}

// podIdentityScript makes, on an emulator of its own, what a script (or eksctl) makes for
// iamServiceAccounts ServiceAccounts, workers at a time: each role, trusting
// pods.eks.amazonaws.com, then its association. It returns how long that took.
func podIdentityScript(ctx context.Context, workers int) (time.Duration, error) {
	emu, api, stop := startIAMEmulator()
	defer stop()
	const ns = "bench-iam-script"
	start := time.Now()
	err := parallel(workers, iamServiceAccounts, func(i int) error {
		sa := fmt.Sprintf("app-%03d", i)
		role, err := api.iam.CreateRole(ctx, awsiam.NewRole{
			Name: irsa.RoleName(ns, sa), Path: irsa.Path(iamBenchCluster),
			TrustPolicy: irsa.TrustPolicy("aws", emu.AccountID(), "", ns, sa, irsa.Parts{Association: true}),
		})
		if err != nil {
			return err
		}
		_, err = api.eks.Create(ctx, awseks.NewAssociation{Cluster: iamBenchCluster, Namespace: ns, ServiceAccount: sa, RoleARN: role.ARN})
		return err
	})
	return time.Since(start), err
}

// iamWorkload is what one iamRun creates: in namespaces named prefix and a number, for
// ServiceAccount i (iamServiceAccounts of them) the IAM objects create makes, policies
// IAMPolicies in all; check says whether AWS holds what they ask for once all are Ready.
type iamWorkload struct {
	prefix   string
	policies int
	create   func(ctx context.Context, c client.Client, ns, name string) error
	check    func(st iamemulator.State, prefix string) error
}

// irsaWorkload: each IAMServiceAccount (IRSA) uses two IAMPolicies of its own, created interleaved.
func irsaWorkload(concurrency int) iamWorkload {
	return iamWorkload{
		prefix:   fmt.Sprintf("bench-iam-c%d-", concurrency),
		policies: iamPolicies,
		create: func(ctx context.Context, c client.Client, ns, name string) error {
			var names []string
			for k := range iamPoliciesPerSA {
				p := benchPolicy(ns, fmt.Sprintf("%s-p%d", name, k))
				if err := c.Create(ctx, p); err != nil {
					return err
				}
				names = append(names, p.Name)
			}
			return c.Create(ctx, &iamv1alpha1.IAMServiceAccount{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec:       iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: name, Policies: names},
			})
		},
		check: checkIRSA,
	}
}

// podIdentityWorkload: each IAMServiceAccount has mechanism PodIdentity and no policies.
func podIdentityWorkload() iamWorkload {
	return iamWorkload{
		prefix: "bench-iam-pi-",
		create: func(ctx context.Context, c client.Client, ns, name string) error {
			return c.Create(ctx, &iamv1alpha1.IAMServiceAccount{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec:       iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: name, Mechanism: iamv1alpha1.MechanismPodIdentity},
			})
		},
		check: checkPodIdentity,
	}
}

type iamFigures struct {
	ready       time.Duration
	awsCalls    int
	awsByAction map[string]int
	apiTotal    int
	apiWrites   int
	writesBy    map[string]int
	idle        time.Duration
	idleAWS     int
	idleAPI     int
	deleted     time.Duration
	deleteCalls int
	refused     int
}

// awsClients are the controller's clients of the emulator (the IRSA case's objects never call EKS).
type awsClients struct {
	iam *awsiam.Client
	eks *awseks.Client
}

// iamRun starts a manager with the iam controllers at the given concurrency, creates the objects
// of w in namespaces of their own, waits until all are Ready, optionally measures an idle period,
// then deletes the namespaces and waits until AWS is empty again.
func iamRun(ctx context.Context, restCfg *rest.Config, c client.Client, emu *iamemulator.Server, api awsClients, w iamWorkload, concurrency int, measureIdle bool) (iamFigures, error) {
	var fig iamFigures
	cfg, apiCount := testenv.Counting(restCfg)
	terminating := &atomic.Int64{}
	mgr, err := newManager(cfg, ctrl.Options{
		// Events and writes the API server refuses in the namespaces being deleted are counted, not printed.
		Logger: logr.New(dropTerminating{LogSink: log.Log.GetSink(), n: terminating}),
		Scheme: c.Scheme(),
	})
	if err != nil {
		return fig, err
	}
	o := &iam.Options{
		ClusterName: iamBenchCluster, OIDCIssuer: "https://oidc.eks.us-east-1.amazonaws.com/id/BENCH", AccountID: emu.AccountID(),
		Partition: "aws", Resync: time.Hour, Concurrency: concurrency,
	}
	if err := iam.SetupWithAWS(mgr, o, api.iam, api.eks); err != nil {
		return fig, err
	}
	stop, err := startManager(ctx, mgr, "iam")
	if err != nil {
		return fig, err
	}
	defer stop()

	// The tenants' namespaces and ServiceAccounts exist before the IAM objects (they are input).
	namespaces := make([]string, iamNamespaces)
	for i := range namespaces {
		namespaces[i] = fmt.Sprintf("%s%02d", w.prefix, i)
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespaces[i]}}); err != nil {
			return fig, err
		}
	}
	saNS := func(i int) (string, string) { return namespaces[i%iamNamespaces], fmt.Sprintf("app-%03d", i) }
	if err := parallel(iamWriters, iamServiceAccounts, func(i int) error {
		ns, name := saNS(i)
		return c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}); err != nil {
		return fig, err
	}
	time.Sleep(time.Second)
	before := emu.State().Calls
	apiCount.Reset()

	start := time.Now()
	if err := parallel(iamWriters, iamServiceAccounts, func(i int) error {
		ns, name := saNS(i)
		return w.create(ctx, c, ns, name)
	}); err != nil {
		return fig, err
	}
	var readyP, readySA int
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Minute, true, func(ctx context.Context) (bool, error) {
		pols, sas := &iamv1alpha1.IAMPolicyList{}, &iamv1alpha1.IAMServiceAccountList{}
		if err := c.List(ctx, pols); err != nil {
			return false, err
		}
		if err := c.List(ctx, sas); err != nil {
			return false, err
		}
		readyP, readySA = 0, 0
		for _, p := range pols.Items {
			if strings.HasPrefix(p.Namespace, w.prefix) && ready(p.Status.Conditions, p.Generation, p.Status.ObservedGeneration) {
				readyP++
			}
		}
		for _, s := range sas.Items {
			if strings.HasPrefix(s.Namespace, w.prefix) && ready(s.Status.Conditions, s.Generation, s.Status.ObservedGeneration) {
				readySA++
			}
		}
		return readyP == w.policies && readySA == iamServiceAccounts, nil
	})
	if err != nil {
		return fig, fmt.Errorf("waiting for all Ready (%d/%d IAMPolicies, %d/%d IAMServiceAccounts): %w", readyP, w.policies, readySA, iamServiceAccounts, err)
	}
	fig.ready = time.Since(start)
	// Let the last status patches land before counting.
	time.Sleep(2 * time.Second)
	fig.awsByAction = diffCalls(before, emu.State().Calls)
	for _, n := range fig.awsByAction {
		fig.awsCalls += n
	}
	fig.apiTotal, fig.apiWrites = apiCount.Total(), apiCount.Writes()
	fig.writesBy = writeSummary(apiCount.Log())
	if err := w.check(emu.State(), w.prefix); err != nil {
		return fig, err
	}

	if measureIdle {
		fig.idle = *iamIdle
		calls := emu.TotalCalls()
		apiCount.Reset()
		time.Sleep(fig.idle)
		fig.idleAWS = emu.TotalCalls() - calls
		fig.idleAPI = apiCount.Total()
	}

	// Deleting the namespaces: the namespace controller deletes the objects, their finalizers
	// the roles, policies and associations.
	calls := emu.TotalCalls()
	start = time.Now()
	for _, ns := range namespaces {
		if err := c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return fig, err
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Minute, true, func(ctx context.Context) (bool, error) {
		st := emu.State()
		return len(st.Roles)+len(st.Policies)+len(st.Associations) == 0, nil
	})
	if err != nil {
		st := emu.State()
		return fig, fmt.Errorf("waiting for AWS to be empty (%d roles, %d policies, %d associations left): %w", len(st.Roles), len(st.Policies), len(st.Associations), err)
	}
	fig.deleted = time.Since(start)
	fig.deleteCalls = emu.TotalCalls() - calls
	fig.refused = int(terminating.Load())
	// The namespaces go once the objects are released.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, ns := range namespaces {
			if err := c.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
				return false, client.IgnoreNotFound(err)
			}
		}
		return true, nil
	})
	return fig, err
}

func benchPolicy(ns, name string) *iamv1alpha1.IAMPolicy {
	return &iamv1alpha1.IAMPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: iamv1alpha1.IAMPolicySpec{Document: iamv1alpha1.PolicyDocument{
			Version: "2012-10-17",
			Statement: []iamv1alpha1.Statement{{
				Effect:   "Allow",
				Action:   iamv1alpha1.Actions{"s3:GetObject", "s3:ListBucket"},
				Resource: iamv1alpha1.Resources{"arn:aws:s3:::" + ns + "-" + name, "arn:aws:s3:::" + ns + "-" + name + "/*"},
			}},
		}},
	}
}

func ready(conds []metav1.Condition, generation, observed int64) bool {
	return observed == generation && meta.IsStatusConditionTrue(conds, iamv1alpha1.ConditionReady)
}

// checkIRSA verifies the emulator holds what irsaWorkload asks for: every role with two policies.
func checkIRSA(st iamemulator.State, prefix string) error {
	roles, policies := 0, 0
	for _, r := range st.Roles {
		if strings.Contains(r.Name, prefix) {
			roles++
			if len(r.AttachedPolicies) != iamPoliciesPerSA {
				return fmt.Errorf("role %s has %d policies attached, want %d", r.Name, len(r.AttachedPolicies), iamPoliciesPerSA)
			}
		}
	}
	for _, p := range st.Policies {
		if strings.Contains(p.Name, prefix) {
			policies++
		}
	}
	if roles != iamServiceAccounts || policies != iamPolicies {
		return fmt.Errorf("AWS holds %d roles and %d policies, want %d and %d", roles, policies, iamServiceAccounts, iamPolicies)
	}
	return nil
}

// checkPodIdentity verifies the emulator holds what podIdentityWorkload asks for: every role
// trusting pods.eks.amazonaws.com only, and one association to it for its ServiceAccount.
func checkPodIdentity(st iamemulator.State, prefix string) error {
	trust := map[string]string{} // role ARN to trust policy
	for _, r := range st.Roles {
		if strings.Contains(r.Name, prefix) {
			trust[r.Arn] = r.AssumeRolePolicyDocument
		}
	}
	associations := 0
	for _, a := range st.Associations {
		if !strings.HasPrefix(a.Namespace, prefix) {
			continue
		}
		associations++
		doc, ok := trust[a.RoleArn]
		if !ok || !strings.Contains(doc, irsa.PodIdentityPrincipal) || strings.Contains(doc, "AssumeRoleWithWebIdentity") {
			return fmt.Errorf("association %s of %s/%s: role %s trusts %q", a.ID, a.Namespace, a.ServiceAccount, a.RoleArn, doc)
		}
	}
	if len(trust) != iamServiceAccounts || associations != iamServiceAccounts {
		return fmt.Errorf("AWS holds %d roles and %d associations, want %d of each", len(trust), associations, iamServiceAccounts)
	}
	return nil
}

func diffCalls(before, after map[string]int) map[string]int {
	out := map[string]int{}
	for action, n := range after {
		if d := n - before[action]; d > 0 {
			out[action] = d
		}
	}
	return out
}

// actionSummary lists the calls by action, most frequent first.
func actionSummary(calls map[string]int) string {
	actions := slices.Collect(maps.Keys(calls))
	slices.SortFunc(actions, func(a, b string) int {
		if calls[a] != calls[b] {
			return calls[b] - calls[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(actions))
	for i, a := range actions {
		parts[i] = fmt.Sprintf("%s %d", a, calls[a])
	}
	return strings.Join(parts, ", ")
}

// dropTerminating drops (and counts) the error logs of requests the API server refused because
// their namespace is being deleted: the Events the controllers record while they clean up.
type dropTerminating struct {
	logr.LogSink
	n *atomic.Int64
}

func (d dropTerminating) Error(err error, msg string, kv ...any) {
	if err != nil && strings.Contains(err.Error(), "because it is being terminated") {
		d.n.Add(1)
		return
	}
	d.LogSink.Error(err, msg, kv...)
}

func (d dropTerminating) WithValues(kv ...any) logr.LogSink {
	return dropTerminating{LogSink: d.LogSink.WithValues(kv...), n: d.n}
}

func (d dropTerminating) WithName(name string) logr.LogSink {
	return dropTerminating{LogSink: d.LogSink.WithName(name), n: d.n}
}

// writeSummary counts the writes of a RequestCounter log ("METHOD path") by method and resource,
// e.g. "PATCH iampolicies/status".
func writeSummary(log []string) map[string]int {
	out := map[string]int{}
	for _, entry := range log {
		method, path, _ := strings.Cut(entry, " ")
		if method == "GET" {
			continue
		}
		segs := strings.Split(strings.Trim(path, "/"), "/")
		if i := slices.Index(segs, "namespaces"); i >= 0 && i+2 < len(segs) {
			segs = segs[i+2:] // resource[/name[/subresource]]
		} else {
			segs = segs[len(segs)-1:]
		}
		resource := segs[0]
		if len(segs) > 2 {
			resource += "/" + segs[2]
		}
		out[method+" "+resource]++
	}
	return out
}
