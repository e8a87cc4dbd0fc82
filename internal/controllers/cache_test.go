package controllers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestAddCacheStartsInAStandby: a manager that does not lead (another holds its Lease) starts a
// controller's cache of one namespace added with AddCache (its warmed-up controllers wait on it),
// and not the same cache added with mgr.Add (which left them to time out: the standby exited).
func TestAddCacheStartsInAStandby(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	// The Lease is someone else's: this manager stays a standby.
	must(t, env.Client.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "standby-test"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("the-leader"), LeaseDurationSeconds: ptr.To[int32](3600),
			RenewTime: &metav1.MicroTime{Time: time.Now()}, AcquireTime: &metav1.MicroTime{Time: time.Now()}},
	}))
	mgr, err := ctrl.New(env.Config, ctrl.Options{
		Scheme: manager.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		LeaderElection: true, LeaderElectionID: "standby-test", LeaderElectionNamespace: "default",
	})
	must(t, err)
	newCache := func() cache.Cache {
		c, err := cache.New(env.Config, cache.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
			DefaultNamespaces: map[string]cache.Config{"default": {}}})
		must(t, err)
		return c
	}
	standby, leaderOnly := newCache(), newCache()
	must(t, controllers.AddCache(mgr, standby))
	must(t, mgr.Add(leaderOnly))
	running := testenv.Run(mgr)
	t.Cleanup(func() {
		if err := running.Stop(); err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	list := func(c cache.Cache) error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return c.List(rctx, &corev1.ConfigMapList{}, client.InNamespace("default"))
	}
	testenv.PollFor(t, "the cache added with AddCache to be read in the standby", 50*time.Millisecond, 30*time.Second, func() (bool, string) {
		err := list(standby)
		return err == nil, "last list: " + testenv.ErrString(err)
	})
	// The control: added plainly, it waits for leadership (reads say it has not started).
	if err := list(leaderOnly); !errors.As(err, new(*cache.ErrCacheNotStarted)) {
		t.Fatalf("a namespaced cache added with mgr.Add answered in a standby (%v): the test shows nothing", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
