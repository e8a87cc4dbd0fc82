package iam

import (
	"context"
	"fmt"
	"maps"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awseks"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const (
	testCluster = "test"
	testIssuer  = "https://oidc.example.com/id/ABC"
	// otherEKSCluster is a second EKS cluster the emulator knows (--eks-cluster-name changes).
	otherEKSCluster = "other"
	allowedARNs     = "arn:aws:iam::aws:policy/ReadOnly*,arn:aws:iam::000000000000:policy/shared/*"
)

var (
	// env is the package's API server: TestIAM's cluster.
	env *testenv.Env
	// logs is what the package's managers log (controller-runtime has one logger per process).
	logs = &testenv.LogBuffer{}
)

func TestMain(m *testing.M) {
	// No stack traces: the tail printed on failure should hold log lines, not frames.
	logf.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(logs), zap.StacktraceLevel(zapcore.PanicLevel)))
	os.Exit(testenv.Package(m, &env, nil))
}

// fixture is one cluster's API server and one IAM emulator shared by a test's cases; managers
// start when a test needs one, so API validation runs with no controller around.
type fixture struct {
	env    *testenv.Env
	scheme *runtime.Scheme
	c      client.Client
	emu    *iamemulator.Server
	aws    *awsiam.Client // the controller's client of the emulator; tests use it to make drift
	eks    *awseks.Client // the same for EKS
	awsCfg aws.Config     // what both were made from
	url    string         // the emulator's endpoint
	opts   Options

	running *testenv.Running // the running manager; nil when none runs
	// stuck is why a manager failed to stop cleanly (with the goroutines still busy, when it overran
	// its grace period): printed last, so a failure's tail names them.
	stuck string
}

// start makes the fixture of the cluster whose API server is cluster, with an emulator of its own.
func start(t *testing.T, cluster *testenv.Env) *fixture {
	t.Helper()
	f := &fixture{env: cluster}
	f.scheme = manager.Scheme(iamv1alpha1.AddToScheme)
	c, err := client.New(f.env.Config, client.Options{Scheme: f.scheme})
	must(t, err)
	f.c = c
	f.emu = iamemulator.New(iamemulator.Options{Seed: 1, EKSClusters: []string{testCluster, otherEKSCluster}})
	ts := httptest.NewServer(f.emu)
	t.Cleanup(ts.Close)
	f.url = ts.URL
	// The SDK's retry decisions with short waits, so fault tests stay quick.
	f.awsCfg = iamemulator.SDKConfig(ts.URL, iamemulator.FixedBackoff(5*time.Millisecond))
	f.aws, f.eks = awsiam.New(f.awsCfg), awseks.New(f.awsCfg)
	f.opts = Options{
		ClusterName: testCluster, OIDCIssuer: testIssuer, Partition: "aws", AllowedPolicyARNs: allowedARNs,
		Resync: time.Hour, ConfigMapCompat: true, Concurrency: 4,
	}
	t.Cleanup(func() {
		f.stop(t)
		if t.Failed() {
			t.Logf("the package's controller logs (last 20 kB):\n%s", logs.Tail(20000))
		}
		if f.stuck != "" {
			t.Logf("the manager failed to stop cleanly: %s", f.stuck)
		}
	})
	return f
}

// otherCluster is a second cluster beside f's, with its own API server and operator (cluster name,
// OIDC issuer, EKS cluster), in f's AWS account: its managers call f's emulator.
func (f *fixture) otherCluster(t *testing.T, name, issuer string) *fixture {
	t.Helper()
	// Another cluster: an API server of its own.
	g := &fixture{env: testenv.Start(t), emu: f.emu, aws: f.aws, eks: f.eks, awsCfg: f.awsCfg, url: f.url, scheme: f.scheme}
	c, err := client.New(g.env.Config, client.Options{Scheme: g.scheme})
	must(t, err)
	g.c = c
	g.opts = f.opts
	g.opts.ClusterName, g.opts.OIDCIssuer = name, issuer
	t.Cleanup(func() {
		g.stop(t)
		if g.stuck != "" {
			t.Logf("cluster %s's manager failed to stop cleanly: %s", name, g.stuck)
		}
	})
	return g
}

// run starts a manager with the iam controllers (with shorter retries).
func (f *fixture) run(t *testing.T, opts Options) {
	t.Helper()
	f.stop(t)
	mgr, err := ctrl.New(f.env.Config, ctrl.Options{
		Scheme:  f.scheme,
		Cache:   cache.Options{DefaultTransform: cache.TransformStripManagedFields()},
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Several managers run in one process: controller names must not collide.
		Controller: crconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	must(t, err)
	cfg, err := opts.validate()
	must(t, err)
	b, err := newBase(mgr, cfg, f.aws, f.eks)
	must(t, err)
	// Failures back off to 2 s at most: under the fault tests' 30% failed calls an object can fail
	// several reconciles in a row, and 1+2+4+…+32 s of backoff would outlast the test's wait.
	b.SlowRetry, b.WaitRetry, b.MaxFailureBackoff = time.Second, 500*time.Millisecond, 2*time.Second
	b.accessPoll = 100 * time.Millisecond
	b.sharedSettle = 300 * time.Millisecond
	must(t, register(mgr, b))
	f.running = testenv.Run(mgr)
}

// stop stops the running manager, if any.
func (f *fixture) stop(t *testing.T) {
	t.Helper()
	if err := f.running.Stop(); err != nil {
		t.Errorf("manager: %v", err)
		if f.stuck == "" {
			f.stuck = err.Error()
		}
	}
	f.running = nil
}

func (f *fixture) namespace(t *testing.T, name string) {
	t.Helper()
	must(t, f.c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
}

func (f *fixture) serviceAccount(t *testing.T, ns, name string) {
	t.Helper()
	must(t, f.c.Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}))
}

// document is a small valid policy document allowing actions on everything.
func document(actions ...string) iamv1alpha1.PolicyDocument {
	return iamv1alpha1.PolicyDocument{Version: "2012-10-17", Statement: []iamv1alpha1.Statement{
		{Effect: "Allow", Action: actions, Resource: iamv1alpha1.Resources{"*"}},
	}}
}

func (f *fixture) policy(t *testing.T, ns, name string, actions ...string) *iamv1alpha1.IAMPolicy {
	t.Helper()
	p := &iamv1alpha1.IAMPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       iamv1alpha1.IAMPolicySpec{Document: document(actions...)},
	}
	must(t, f.c.Create(context.Background(), p))
	return p
}

func (f *fixture) iamsa(t *testing.T, ns, name string, spec iamv1alpha1.IAMServiceAccountSpec) *iamv1alpha1.IAMServiceAccount {
	t.Helper()
	sa := &iamv1alpha1.IAMServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	must(t, f.c.Create(context.Background(), sa))
	return sa
}

// waitReady waits until obj (an IAMPolicy or IAMServiceAccount) is Ready for its generation and
// returns it as read.
func waitReady[T client.Object](t *testing.T, f *fixture, obj T) T {
	t.Helper()
	return waitCondition(t, f, obj, ReasonSynced)
}

// waitCondition waits until obj's Ready condition has reason for its current generation.
func waitCondition[T client.Object](t *testing.T, f *fixture, obj T, reason string) T {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	testenv.Eventually(t, fmt.Sprintf("%T %s Ready reason %s", obj, key, reason), func() (bool, string) {
		if err := f.c.Get(context.Background(), key, obj); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(status.ConditionsOf(obj), iamv1alpha1.ConditionReady)
		if c == nil {
			return false, "no Ready condition"
		}
		return c.Reason == reason && c.ObservedGeneration == obj.GetGeneration(), c.Reason + ": " + c.Message
	})
	return obj
}

// waitGone waits until the object is deleted.
func (f *fixture) waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%T %s to be gone", obj, obj.GetName()), func() (bool, string) {
		err := f.c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
		return client.IgnoreNotFound(err) == nil && err != nil, testenv.ErrString(err)
	})
}

func (f *fixture) role(name string) *iamemulator.RoleState {
	for _, r := range f.emu.State().Roles {
		if r.Name == name {
			return &r
		}
	}
	return nil
}

func (f *fixture) awsPolicy(arn string) *iamemulator.PolicyState {
	for _, p := range f.emu.State().Policies {
		if p.Arn == arn {
			return &p
		}
	}
	return nil
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// update changes an object, retrying on conflicts.
func update[T client.Object](t *testing.T, f *fixture, obj T, change func(T)) {
	t.Helper()
	testenv.Eventually(t, "updating "+obj.GetName(), func() (bool, string) {
		if err := f.c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, err.Error()
		}
		change(obj)
		err := f.c.Update(context.Background(), obj)
		return err == nil, testenv.ErrString(err)
	})
}

func request(obj client.Object) reconcile.Request {
	return reconcile.Request{NamespacedName: client.ObjectKeyFromObject(obj)}
}

// standalonePolicy and standaloneServiceAccount are reconcilers outside the manager, for calling
// Reconcile directly; they read through the test's uncached client. Their AWS clients count what
// they send: the emulator counts every caller's requests, and the fixture's manager may still be
// reconciling the same object (an Event, a status write) while a test measures one reconcile.
func (f *fixture) standaloneBase(t *testing.T) (*base, *sdkCalls) {
	t.Helper()
	cfg, err := f.opts.validate()
	must(t, err)
	calls := &sdkCalls{n: map[string]int{}}
	awsCfg := f.awsCfg.Copy()
	awsCfg.APIOptions = append(awsCfg.APIOptions, calls.count)
	return &base{client: f.c, apiReader: f.c, recorder: events.NewFakeRecorder(100), aws: awsiam.New(awsCfg), eks: awseks.New(awsCfg), cfg: cfg, account: f.emu.AccountID(),
		SlowRetry: time.Second, WaitRetry: time.Second}, calls
}

func (f *fixture) standalonePolicy(t *testing.T) (*PolicyReconciler, *sdkCalls) {
	b, calls := f.standaloneBase(t)
	return &PolicyReconciler{base: b}, calls
}

func (f *fixture) standaloneServiceAccount(t *testing.T) (*ServiceAccountReconciler, *sdkCalls) {
	b, calls := f.standaloneBase(t)
	return &ServiceAccountReconciler{base: b}, calls
}

// sdkCalls counts the requests one set of AWS clients sends, per operation and attempt (it runs
// after the retry middleware), named as the emulator names them.
type sdkCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *sdkCalls) count(stack *middleware.Stack) error {
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("QuartermasterTestCount",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			c.mu.Lock()
			c.n[awsmiddleware.GetOperationName(ctx)]++
			c.mu.Unlock()
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

// Calls returns the counts so far, per operation.
func (c *sdkCalls) Calls() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// diffCalls is after minus before, per IAM action, without zeros.
func diffCalls(before, after map[string]int) map[string]int {
	d := map[string]int{}
	for k, v := range after {
		if n := v - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

func awsNewRole(name string) awsiam.NewRole {
	return awsiam.NewRole{Name: name, Path: "/", TrustPolicy: `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}`}
}
