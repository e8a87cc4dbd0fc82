package iam

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testStaleCache reconciles twice while reads lag behind the controller's own writes (as the
// informer cache does for a few milliseconds): the second reconcile must neither announce again
// nor call IAM for more than its usual drift check, nor write more than a fresh read would.
func testStaleCache(t *testing.T, f *fixture) {
	// The reconcilers are called directly: no manager may reconcile these objects meanwhile.
	f.stop(t)
	defer f.run(t, f.opts)
	ns := "t-stale"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "app")
	cfg, counter := testenv.Counting(f.env.Config)
	counted, err := client.New(cfg, client.Options{Scheme: f.scheme})
	must(t, err)
	lagging := testenv.Lagging(counted)
	b, _ := f.standaloneBase(t)
	b.client = guarded(lagging)
	rec := events.NewFakeRecorder(100)
	b.recorder = rec
	policies, accounts := &PolicyReconciler{base: b}, &ServiceAccountReconciler{base: b}

	p := f.policy(t, ns, "read", "s3:GetObject")
	sa := f.iamsa(t, ns, "app", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "app", Policies: []string{"read"}})

	mustReconcile(t, policies.Reconcile, p)
	mustReconcile(t, accounts.Reconcile, sa)
	if lagging.Lags() == 0 {
		t.Fatal("the reads do not lag: the test proves nothing")
	}
	if got := testenv.EventReasons(rec); !slices.Equal(got, []string{"PolicyCreated", "RoleCreated"}) {
		t.Fatalf("first reconciles: Events %v, want PolicyCreated, RoleCreated (the role attached the policy the lagging reader does not show yet)", got)
	}
	before := f.emu.State().Calls
	counter.Reset()

	mustReconcile(t, policies.Reconcile, p)
	mustReconcile(t, accounts.Reconcile, sa)

	if got := testenv.EventReasons(rec); len(got) > 0 {
		t.Errorf("reconciles on the stale copies recorded Events %v, want none", got)
	}
	want := map[string]int{"GetPolicy": 1, "GetPolicyVersion": 1, "GetRole": 1, "ListAttachedRolePolicies": 1}
	if calls := diffCalls(before, f.emu.State().Calls); !maps.Equal(calls, want) {
		t.Errorf("IAM calls on the stale copies = %v, want the drift check's reads %v", calls, want)
	}
	// The one write is the policy's message going from "created" to "in sync", as after any
	// creation, with fresh reads as with stale ones.
	writes := slices.DeleteFunc(counter.Log(), func(r string) bool { return strings.HasPrefix(r, "GET ") })
	if len(writes) != 1 || !strings.Contains(writes[0], "PATCH") || !strings.Contains(writes[0], "/iampolicies/read/status") {
		t.Errorf("API writes on the stale copies: %v, want one status patch of the policy's message", writes)
	}
}

type reconcileFunc = func(context.Context, reconcile.Request) (reconcile.Result, error)

func mustReconcile(t *testing.T, r reconcileFunc, obj client.Object) {
	t.Helper()
	if _, err := r(context.Background(), request(obj)); err != nil {
		t.Fatalf("reconciling %s: %v", obj.GetName(), err)
	}
}
