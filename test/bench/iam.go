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

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
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
	scheme := manager.Scheme(iamv1alpha1.AddToScheme)
	c, err := client.New(e.cluster.Config, client.Options{Scheme: scheme})
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

	emu := iamemulator.New(iamemulator.Options{Seed: 1})
	srv := httptest.NewServer(emu)
	defer srv.Close()
	awsCfg := aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDBENCHEXAMPLE", "not-a-secret", ""),
		BaseEndpoint: aws.String(srv.URL),
		HTTPClient:   awsiam.HTTPClient(),
		Retryer:      func() aws.Retryer { return awsiam.NewRetryer() },
	}
	api := awsClients{iam: awsiam.New(awsCfg), eks: awseks.New(awsCfg)}

	var out []result
	var base float64
	for _, concurrency := range []int{8, 1} {
		fig, err := iamRun(ctx, e.cluster.Config, c, emu, api, concurrency, concurrency == 8)
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
			result{metric: "IAM calls per IAMServiceAccount with its 2 IAMPolicies", value: float64(fig.iamCalls) / iamServiceAccounts, unit: "calls",
				note: fmt.Sprintf("%d calls: %s", fig.iamCalls, actionSummary(fig.iamByAction))},
			result{metric: "IAM calls per object", value: float64(fig.iamCalls) / objects, unit: "calls"},
			result{metric: "API requests per object (reads + writes)", value: float64(fig.apiTotal) / objects, unit: "requests",
				note: "ServiceAccounts are read uncached"},
			result{metric: "API writes per object", value: float64(fig.apiWrites) / objects, unit: "requests",
				note: actionSummary(fig.writesBy)},
			result{metric: fmt.Sprintf("IAM calls during %s idle (must be 0 between resyncs)", fig.idle), value: float64(fig.idleIAM), unit: "calls",
				note: "--iam-resync 1h (jittered by 10%)"},
			result{metric: fmt.Sprintf("API requests during %s idle", fig.idle), value: float64(fig.idleAPI), unit: "requests",
				note: "watches reconnecting only"},
			result{metric: "namespace deletion: seconds until every role and policy is gone from AWS", value: fig.deleted.Seconds(), unit: "s",
				note: fmt.Sprintf("%d namespaces; %d IAM calls; %d Events or writes refused in terminating namespaces", iamNamespaces, fig.deleteCalls, fig.refused)},
		)
	}
	return out, nil
}

type iamFigures struct {
	ready       time.Duration
	iamCalls    int
	iamByAction map[string]int
	apiTotal    int
	apiWrites   int
	writesBy    map[string]int
	idle        time.Duration
	idleIAM     int
	idleAPI     int
	deleted     time.Duration
	deleteCalls int
	refused     int
}

// iamRun starts a manager with the iam controllers at the given concurrency, creates the objects
// in namespaces of their own, waits until all are Ready, optionally measures an idle period, then
// deletes the namespaces and waits until AWS is empty again.
// awsClients are the controller's clients of the emulator (the bench's IRSA objects never call EKS).
type awsClients struct {
	iam *awsiam.Client
	eks *awseks.Client
}

func iamRun(ctx context.Context, restCfg *rest.Config, c client.Client, emu *iamemulator.Server, api awsClients, concurrency int, measureIdle bool) (iamFigures, error) {
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
		ClusterName: "bench", OIDCIssuer: "https://oidc.eks.us-east-1.amazonaws.com/id/BENCH", AccountID: emu.AccountID(),
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
		namespaces[i] = fmt.Sprintf("bench-iam-c%d-%02d", concurrency, i)
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

	// ServiceAccount i uses policies 2i and 2i+1 of its namespace; both kinds are created interleaved.
	start := time.Now()
	if err := parallel(iamWriters, iamServiceAccounts, func(i int) error {
		ns, name := saNS(i)
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
			if strings.HasPrefix(p.Namespace, "bench-iam-c"+fmt.Sprint(concurrency)+"-") && ready(p.Status.Conditions, p.Generation, p.Status.ObservedGeneration) {
				readyP++
			}
		}
		for _, s := range sas.Items {
			if strings.HasPrefix(s.Namespace, "bench-iam-c"+fmt.Sprint(concurrency)+"-") && ready(s.Status.Conditions, s.Generation, s.Status.ObservedGeneration) {
				readySA++
			}
		}
		return readyP == iamPolicies && readySA == iamServiceAccounts, nil
	})
	if err != nil {
		return fig, fmt.Errorf("waiting for all Ready (%d/%d IAMPolicies, %d/%d IAMServiceAccounts): %w", readyP, iamPolicies, readySA, iamServiceAccounts, err)
	}
	fig.ready = time.Since(start)
	// Let the last status patches land before counting.
	time.Sleep(2 * time.Second)
	fig.iamByAction = diffCalls(before, emu.State().Calls)
	for _, n := range fig.iamByAction {
		fig.iamCalls += n
	}
	fig.apiTotal, fig.apiWrites = apiCount.Total(), apiCount.Writes()
	fig.writesBy = writeSummary(apiCount.Log())
	if err := checkAWS(emu, concurrency); err != nil {
		return fig, err
	}

	if measureIdle {
		fig.idle = *iamIdle
		calls := emu.TotalCalls()
		apiCount.Reset()
		time.Sleep(fig.idle)
		fig.idleIAM = emu.TotalCalls() - calls
		fig.idleAPI = apiCount.Total()
	}

	// Deleting the namespaces: the namespace controller deletes the objects, their finalizers
	// the roles and policies.
	calls := emu.TotalCalls()
	start = time.Now()
	for _, ns := range namespaces {
		if err := c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return fig, err
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Minute, true, func(ctx context.Context) (bool, error) {
		st := emu.State()
		return len(st.Roles) == 0 && len(st.Policies) == 0, nil
	})
	if err != nil {
		st := emu.State()
		return fig, fmt.Errorf("waiting for AWS to be empty (%d roles, %d policies left): %w", len(st.Roles), len(st.Policies), err)
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

// checkAWS verifies the emulator holds what the objects ask for: every role with two policies.
func checkAWS(emu *iamemulator.Server, concurrency int) error {
	st := emu.State()
	prefix := fmt.Sprintf("bench-iam-c%d-", concurrency)
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
