package namespaces

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestStaleReadsRepeatNothing serves a request, then reconciles it again while reads lag behind
// the last reconcile's writes (as the informer cache does for a few milliseconds): no Event, no
// annotation write and no token is repeated.
func TestStaleReadsRepeatNothing(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	// A requests namespace the running manager does not serve: this reconciler alone acts on it.
	rns := env.Namespace(t)
	cfg, counter := testenv.Counting(env.Config)
	counted, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	must(t, err)
	lagging := testenv.Lagging(counted)
	rec := events.NewFakeRecorder(100)
	r := *f.reconciler
	policy := *r.Policy
	policy.RequestsNamespace = rns
	r.Policy, r.Recorder, r.APIReader = &policy, rec, counted
	r.Client = status.NewClient(lagging, &corev1.ConfigMap{}, &corev1.Secret{}, &corev1.Namespace{})

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: rns, Name: "lagged"}, Data: map[string]string{"ttl": "72h"}}
	must(t, f.c.Create(ctx, cm))
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(cm)}
	// Serve it, with the reads current at the start of each reconcile and lagging within it.
	for i := 0; cm.Annotations[nsrequest.AnnotationStatus] != string(nsrequest.StatusReady); i++ {
		if i == 10 {
			t.Fatalf("not Ready after 10 reconciles: %v", cm.Annotations)
		}
		lagging.CatchUp()
		_, err := r.Reconcile(ctx, req)
		must(t, err)
		must(t, f.c.Get(ctx, req.NamespacedName, cm))
	}
	testenv.EventReasons(rec)
	// reconcileTwice makes a change through the reconciler, then reconciles again on reads that
	// do not show the change yet.
	reconcileTwice := func(t *testing.T, wantEvent string) {
		t.Helper()
		_, err := r.Reconcile(ctx, req)
		must(t, err)
		if got := testenv.EventReasons(rec); len(got) != 1 || got[0] != wantEvent {
			t.Fatalf("the change recorded Events %v, want %s", got, wantEvent)
		}
		if lagging.Lags() == 0 {
			t.Fatal("the reads do not lag: the test proves nothing")
		}
		counter.Reset()
		_, err = r.Reconcile(ctx, req)
		must(t, err)
		if got := testenv.EventReasons(rec); len(got) > 0 {
			t.Errorf("a reconcile on stale reads recorded Events %v", got)
		}
		var writes []string
		for _, call := range counter.Log() {
			if !strings.HasPrefix(call, "GET ") {
				writes = append(writes, call)
			}
		}
		if len(writes) > 0 {
			t.Errorf("a reconcile on stale reads wrote: %v", writes)
		}
	}

	t.Run("a token rotation is not repeated", func(t *testing.T) {
		lagging.CatchUp()
		// A new API server URL to hand out: the kubeconfig is rewritten with a new token.
		r.Server = "https://api.example.com:6443"
		reconcileTwice(t, "CredentialsRefreshed")
	})

	t.Run("a new status is written and announced once", func(t *testing.T) {
		lagging.CatchUp()
		must(t, f.c.Get(ctx, req.NamespacedName, cm))
		cm.Data["ttl"] = "soon"
		must(t, f.c.Update(ctx, cm))
		reconcileTwice(t, "InvalidTTL")
	})
}
