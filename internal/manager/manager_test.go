package manager_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/yaml"

	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

var widgetGVK = schema.GroupVersionKind{Group: "test.quartermaster.dev", Version: "v1", Kind: "Widget"}

// widgetController reconciles test Widgets and reports each reconciled name.
func widgetController(reconciled chan<- string) controllers.Controller {
	return controllers.Controller{
		Name:     "widgets",
		Requires: []schema.GroupVersionKind{widgetGVK},
		Setup: func(mgr ctrl.Manager, _ *controllers.Kinds) error {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(widgetGVK)
			return builder.ControllerManagedBy(mgr).For(u).Named("widgets").Complete(
				reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
					reconciled <- req.Name
					return reconcile.Result{}, nil
				}))
		},
	}
}

func unconfiguredController() controllers.Controller {
	return controllers.Controller{
		Name:       "needs-config",
		Configured: func() error { return errors.New("--needs-config-endpoint is required") },
		Setup:      func(ctrl.Manager, *controllers.Kinds) error { return errors.New("must not be set up") },
	}
}

func TestUnknownControllerIsAnErrorNamingTheValidOnes(t *testing.T) {
	all := []controllers.Controller{widgetController(nil), unconfiguredController()}
	err := manager.Run(context.Background(), []string{"--controllers=nonsense"}, all, manager.Scheme(), &testenv.LogBuffer{})
	if err == nil {
		t.Fatal("Run accepted an unknown controller")
	}
	for _, want := range []string{`"nonsense"`, "widgets", "needs-config"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestNamedControllerWithoutConfigurationIsAnError(t *testing.T) {
	all := []controllers.Controller{widgetController(nil), unconfiguredController()}
	err := manager.Run(context.Background(), []string{"--controllers=widgets,needs-config"}, all, manager.Scheme(), &testenv.LogBuffer{})
	if err == nil || !strings.Contains(err.Error(), "--needs-config-endpoint") {
		t.Fatalf("want an error naming the missing flag, got %v", err)
	}
}

func TestLeaseSettingsLeaderElectionWouldRefuseAreRefusedAtOnce(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--leader-elect-retry-period=0s"}, "--leader-elect-retry-period must be positive"},
		{[]string{"--leader-elect-retry-period=9s"}, "--leader-elect-renew-deadline (10s) must be longer than 1.2 × --leader-elect-retry-period (9s)"},
		{[]string{"--leader-elect-lease-duration=10s"}, "--leader-elect-lease-duration (10s) must be longer than --leader-elect-renew-deadline (10s)"},
	} {
		_, err := manager.ParseFlags(tc.args, nil, &testenv.LogBuffer{})
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	o, err := manager.ParseFlags([]string{"--leader-elect-lease-duration=6s", "--leader-elect-renew-deadline=4s", "--leader-elect-retry-period=500ms"}, nil, &testenv.LogBuffer{})
	if err != nil || o.LeaseDuration != 6*time.Second || o.RenewDeadline != 4*time.Second || o.RetryPeriod != 500*time.Millisecond {
		t.Errorf("shorter consistent settings: %+v, %v", o, err)
	}
}

// TestControllerWaitsForItsCRDAndStartsWhenInstalled runs the whole manager against a real API
// server that does not serve the controller's kind yet, then installs the CRD.
func TestControllerWaitsForItsCRDAndStartsWhenInstalled(t *testing.T) {
	env := testenv.Start(t)
	kubeconfig := env.KubeconfigFor(t, "test-admin", "system:masters")

	reconciled := make(chan string, 10)
	all := []controllers.Controller{widgetController(reconciled), unconfiguredController()}
	logs := &testenv.LogBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- manager.Run(ctx, []string{
			"--kubeconfig=" + kubeconfig,
			"--health-probe-bind-address=0",
			"--crd-poll-interval=100ms",
		}, all, manager.Scheme(), logs)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager exited with %v", err)
		}
	})

	testenv.PollFor(t, "the waiting message", 50*time.Millisecond, time.Minute, func() (bool, string) {
		out := logs.String()
		return strings.Contains(out, "waiting for the CustomResourceDefinition"), "logs:\n" + out
	})
	if !strings.Contains(logs.String(), "--needs-config-endpoint is required") {
		t.Errorf("the unconfigured controller's reason was not logged:\n%s", logs)
	}
	select {
	case err := <-done:
		t.Fatalf("manager exited while a CRD was missing: %v", err)
	default:
	}

	installCRD(t, env.Client, filepath.Join(testenv.RepoRoot(), "internal", "testing", "testdata", "crds", "widgets.yaml"))
	w := &unstructured.Unstructured{}
	w.SetGroupVersionKind(widgetGVK)
	w.SetNamespace("default")
	w.SetName("first")
	// The test's own client learns the new kind once discovery serves it.
	testenv.PollFor(t, "the Widget create to succeed", 50*time.Millisecond, time.Minute, func() (bool, string) {
		err := env.Client.Create(context.Background(), w)
		return err == nil, "last error: " + testenv.ErrString(err) + "; logs:\n" + logs.String()
	})
	select {
	case name := <-reconciled:
		if name != "first" {
			t.Errorf("reconciled %q, want first", name)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the controller did not start after its CRD was installed; logs:\n%s", logs)
	}
	// Every poll of the wait is behind us (the controller started): the missing CRD was said once
	// (internal/controllers' TestStarterLogsAMissingKindOnceAndStartsWhenServed counts the polls).
	if n := strings.Count(logs.String(), "waiting for the CustomResourceDefinition"); n != 1 {
		t.Errorf("the missing CRD was logged %d times, want once", n)
	}
}

func installCRD(t *testing.T, c client.Client, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(context.Background(), crd); err != nil {
		t.Fatal(err)
	}
}
