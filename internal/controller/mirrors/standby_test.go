package mirrors

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestStandbyKeepsRunning: a replica that does not lead (another holds the Lease) warms its
// controller up, as the binary's managers do (EnableWarmup): its sources wait for the controller's
// own cache, which must start in the standby too. On a real node the chart's second replica exited
// every two minutes (CacheSyncTimeout) with "timed out waiting for cache to be synced".
func TestStandbyKeepsRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.Namespace(t)
	must(t, env.Client.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mirrors-standby"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("the-leader"), LeaseDurationSeconds: ptr.To[int32](3600),
			RenewTime: &metav1.MicroTime{Time: time.Now()}, AcquireTime: &metav1.MicroTime{Time: time.Now()}},
	}))
	mgr, err := ctrl.New(env.Config, ctrl.Options{
		Scheme:         manager.Scheme(registryv1alpha1.AddToScheme),
		Cache:          cache.Options{DefaultTransform: cachemeta.Transform},
		Metrics:        metricsserver.Options{BindAddress: "0"},
		LeaderElection: true, LeaderElectionID: "mirrors-standby", LeaderElectionNamespace: ns,
		Controller: config.Controller{
			EnableWarmup: ptr.To(true), SkipNameValidation: ptr.To(true), CacheSyncTimeout: 3 * time.Second,
		},
	})
	must(t, err)
	_, err = setup(mgr, Options{Namespace: ns, Image: "quartermaster:test", AgentServiceAccount: "quartermaster-node-agent",
		Concurrency: 1, Resync: time.Hour, PrepareStorage: true})
	must(t, err)
	running := testenv.Run(mgr)
	// Twice the sync timeout: a standby whose sources cannot sync has exited by then.
	select {
	case err := <-running.Done():
		t.Fatalf("the standby exited: %v", err)
	case <-time.After(6 * time.Second):
	}
	if err := running.Stop(); err != nil {
		t.Errorf("stopping the standby: %v", err)
	}
}
