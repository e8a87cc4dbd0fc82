package awseks_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awseks"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

const (
	cluster = "prod"
	roleA   = "arn:aws:iam::000000000000:role/a"
	roleB   = "arn:aws:iam::000000000000:role/b"
)

func newClient(t *testing.T, opts iamemulator.Options) (*awseks.Client, *iamemulator.Server) {
	t.Helper()
	opts.EKSClusters = []string{cluster}
	emu := iamemulator.New(opts)
	ts := httptest.NewServer(emu)
	t.Cleanup(ts.Close)
	return awseks.New(iamemulator.SDKConfig(ts.URL, iamemulator.FixedBackoff(time.Millisecond))), emu
}

// externalCalls reads quartermaster_external_requests_total{service="eks",operation,result}.
func externalCalls(t *testing.T, operation, result string) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "quartermaster_external_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "service") == "eks" && label(m, "operation") == operation && label(m, "result") == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestClient: every adapter call against the emulator through the real SDK, the errors it
// classifies, and one metric sample per call (retries included) under service="eks".
func TestClient(t *testing.T) {
	c, emu := newClient(t, iamemulator.Options{Seed: 3})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createdBefore := externalCalls(t, "CreatePodIdentityAssociation", "ok")
	inUseBefore := externalCalls(t, "CreatePodIdentityAssociation", "ResourceInUseException")

	a, err := c.Create(ctx, awseks.NewAssociation{Cluster: cluster, Namespace: "team-a", ServiceAccount: "app", RoleARN: roleA,
		Tags: map[string]string{"quartermaster.dev/cluster": "test"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == "" || a.ARN == "" || a.RoleARN != roleA || a.Namespace != "team-a" || a.ServiceAccount != "app" || a.Tags["quartermaster.dev/cluster"] != "test" {
		t.Fatalf("created %+v", a)
	}
	_, err = c.Create(ctx, awseks.NewAssociation{Cluster: cluster, Namespace: "team-a", ServiceAccount: "app", RoleARN: roleB})
	if !awseks.IsInUse(err) {
		t.Errorf("a second association: %v, want ResourceInUseException", err)
	}
	if msg := awsiam.StatusMessage(err); msg != `eks CreatePodIdentityAssociation "prod" "team-a/app": ResourceInUseException: Association already exists: `+a.ID+` (HTTP 409)` {
		t.Errorf("message %q", msg)
	}

	found, err := c.Find(ctx, cluster, "team-a", "app")
	if err != nil || len(found) != 1 || found[0].ID != a.ID || found[0].ARN != a.ARN {
		t.Fatalf("Find = %+v, %v", found, err)
	}
	if none, err := c.Find(ctx, cluster, "team-a", "other"); err != nil || len(none) != 0 {
		t.Errorf("Find of another ServiceAccount = %+v, %v", none, err)
	}
	if u, err := c.Update(ctx, a, roleB, awseks.Target{}); err != nil || u.RoleARN != roleB {
		t.Errorf("SetRole = %+v, %v", u, err)
	}
	if err := c.Tag(ctx, a.ARN, map[string]string{"quartermaster.dev/name": "app"}); err != nil {
		t.Fatal(err)
	}
	d, err := c.Describe(ctx, cluster, a.ID)
	if err != nil || d.RoleARN != roleB || d.Tags["quartermaster.dev/name"] != "app" || d.Tags["quartermaster.dev/cluster"] != "test" {
		t.Errorf("Describe = %+v, %v", d, err)
	}
	if err := c.Delete(ctx, cluster, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Describe(ctx, cluster, a.ID); !awseks.IsNotFound(err) {
		t.Errorf("Describe after Delete: %v, want ResourceNotFoundException", err)
	}
	if err := c.Delete(ctx, cluster, a.ID); !awseks.IsNotFound(err) {
		t.Errorf("Delete twice: %v, want ResourceNotFoundException", err)
	}

	if got := externalCalls(t, "CreatePodIdentityAssociation", "ok") - createdBefore; got != 1 {
		t.Errorf("%v ok samples of CreatePodIdentityAssociation, want 1", got)
	}
	if got := externalCalls(t, "CreatePodIdentityAssociation", "ResourceInUseException") - inUseBefore; got != 1 {
		t.Errorf("%v ResourceInUseException samples, want 1", got)
	}
	if emu.Calls("CreatePodIdentityAssociation") != 2 || emu.Calls("DescribePodIdentityAssociation") != 2 {
		t.Errorf("emulator counted %v", emu.State().Calls)
	}
}

// TestThrottlingIsRetriedAndClassified: throttling is retried by the SDK within one call (one
// metric sample), and what is left after the attempts is a throttle for the controller.
func TestThrottlingIsRetriedAndClassified(t *testing.T) {
	c, emu := newClient(t, iamemulator.Options{Seed: 4, FailRate: 1, FailKinds: []iamemulator.FaultKind{iamemulator.FaultThrottle}})
	before := externalCalls(t, "ListPodIdentityAssociations", "ThrottlingException")
	_, err := c.Find(context.Background(), cluster, "team-a", "app")
	if !awsiam.IsThrottleOrServer(err) || awseks.IsNotFound(err) {
		t.Fatalf("Find under throttling: %v, want a throttle", err)
	}
	if n := emu.Calls("ListPodIdentityAssociations"); n != awsiam.MaxAttempts {
		t.Errorf("%d attempts, want %d", n, awsiam.MaxAttempts)
	}
	if got := externalCalls(t, "ListPodIdentityAssociations", "ThrottlingException") - before; got != 1 {
		t.Errorf("%v samples for one call with its retries, want 1", got)
	}
}
