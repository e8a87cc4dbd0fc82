package vmgroups

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

func object(name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(computev1alpha1.GroupVersion.WithKind("VmGroup"))
	u.SetNamespace("t-validation")
	u.SetName(name)
	return u
}

func validSpec() map[string]any {
	return map[string]any{"cpu": int64(2), "memory": int64(4), "template": "tmpl-a", "replicas": int64(2)}
}

func with(key string, value any) map[string]any {
	s := validSpec()
	if value == nil {
		delete(s, key)
	} else {
		s[key] = value
	}
	return s
}

// testValidation proves that the API server rejects each bad spec with a clear message: one case
// per rule. Creates are dry runs, so no controller sees them.
func testValidation(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-validation")
	cases := []struct {
		name   string
		obj    *unstructured.Unstructured
		reject string // "" accepts
	}{
		{name: "valid", obj: object("web", validSpec())},
		{name: "cpu below 1", obj: object("web", with("cpu", int64(0))), reject: "spec.cpu: Invalid value: 0: spec.cpu in body should be greater than or equal to 1"},
		{name: "cpu above 4", obj: object("web", with("cpu", int64(5))), reject: "spec.cpu in body should be less than or equal to 4"},
		{name: "cpu missing", obj: object("web", with("cpu", nil)), reject: "spec.cpu: Required value"},
		{name: "memory below 1", obj: object("web", with("memory", int64(0))), reject: "spec.memory in body should be greater than or equal to 1"},
		{name: "memory above 8", obj: object("web", with("memory", int64(9))), reject: "spec.memory in body should be less than or equal to 8"},
		{name: "memory missing", obj: object("web", with("memory", nil)), reject: "spec.memory: Required value"},
		{name: "template missing", obj: object("web", with("template", nil)), reject: "spec.template: Required value"},
		{name: "replicas above 1000", obj: object("web", with("replicas", int64(1001))), reject: "spec.replicas in body should be less than or equal to 1000"},
		{name: "readiness unknown", obj: object("web", with("readiness", "Ping")), reject: `spec.readiness: Unsupported value: "Ping"`},
		{name: "shutdown timeout negative", obj: object("web", with("shutdownTimeout", "-1s")), reject: "shutdownTimeout must be between 0s and 1h"},
		{name: "shutdown timeout above 1h", obj: object("web", with("shutdownTimeout", "2h")), reject: "shutdownTimeout must be between 0s and 1h"},
		{name: "user data without a Secret", obj: object("web", with("userData", map[string]any{"key": "x"})), reject: "spec.userData.secretName: Required value"},
		{name: "metadata not an object", obj: object("web", with("metadata", "hostname: x")), reject: "spec.metadata: Invalid value"},
		{name: "template empty", obj: object("web", with("template", "")), reject: "spec.template in body should be at least 1 chars long"},
		{name: "template too long", obj: object("web", with("template", strings.Repeat("t", 256))), reject: "spec.template: Too long"},
		{name: "template with spaces", obj: object("web", with("template", " tmpl-a")), reject: "template must not start or end with spaces"},
		{name: "replicas negative", obj: object("web", with("replicas", int64(-1))), reject: "spec.replicas in body should be greater than or equal to 0"},
		{name: "placement field too long", obj: object("web", with("placement", map[string]any{"datacenter": strings.Repeat("d", 256)})), reject: "spec.placement.datacenter: Too long"},
		{name: "name with upper case", obj: object("Web", validSpec()), reject: "metadata.name must be a DNS label of at most 50 characters"},
		{name: "name with a dot", obj: object("web.a", validSpec()), reject: "metadata.name must be a DNS label of at most 50 characters"},
		{name: "name too long", obj: object(strings.Repeat("w", 51), validSpec()), reject: "metadata.name must be a DNS label of at most 50 characters"},
		{name: "name of 50 characters", obj: object(strings.Repeat("w", 50), validSpec())},
		{name: "clone mode unknown", obj: object("web", with("cloneMode", "Instant")), reject: `spec.cloneMode: Unsupported value: "Instant"`},
		{name: "linked with a snapshot", obj: object("web", func() map[string]any { s := with("cloneMode", "Linked"); s["snapshot"] = "base"; return s }())},
		{name: "a snapshot without linked clones", obj: object("web", with("snapshot", "base")), reject: "snapshot names what linked clones are made from: set cloneMode: Linked, or remove snapshot"},
		{name: "an address pool", obj: object("web", with("addressPool", map[string]any{"network": "10.0.0.0/24", "addresses": []any{"10.0.0.5", "10.0.0.9"}, "gateway": "10.0.0.1", "nameservers": []any{"10.0.0.2"}}))},
		{name: "an address pool without network", obj: object("web", with("addressPool", map[string]any{"addresses": []any{"10.0.0.5"}})), reject: "spec.addressPool.network: Required value"},
		{name: "an address pool network not a CIDR", obj: object("web", with("addressPool", map[string]any{"network": "10.0.0.0"})), reject: "spec.addressPool.network in body should match"},
		{name: "an address pool entry not an address", obj: object("web", with("addressPool", map[string]any{"network": "10.0.0.0/24", "addresses": []any{"10.0.0.5", "web-1"}})), reject: "spec.addressPool.addresses[1] in body should match"},
		{name: "an address pool smaller than replicas", obj: object("web", with("addressPool", map[string]any{"network": "10.0.0.0/24", "addresses": []any{"10.0.0.5"}})), reject: "spec.replicas is more than addressPool.addresses lists: each VM needs an address of its own"},
		{name: "an address pool range, counted by the controller", obj: object("web", with("addressPool", map[string]any{"network": "10.0.0.0/24", "addresses": []any{"10.0.0.5-10.0.0.5"}}))},
		{name: "an address pool with its gateway", obj: object("web", with("addressPool", map[string]any{"network": "10.0.0.0/24", "addresses": []any{"10.0.0.1", "10.0.0.5"}, "gateway": "10.0.0.1"})), reject: "the gateway cannot be in the pool's addresses"},
		{name: "a snapshot with full clones", obj: object("web", func() map[string]any { s := with("cloneMode", "Full"); s["snapshot"] = "base"; return s }()), reject: "set cloneMode: Linked"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := f.c.Create(ctx, c.obj, client.DryRunAll)
			if c.reject == "" {
				must(t, err)
				return
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.reject) {
				t.Fatalf("got %v; want Invalid with %q", err, c.reject)
			}
		})
	}

	t.Run("the sample is valid", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", "vmgroups", "vmgroup.yaml"))
		must(t, err)
		obj := &unstructured.Unstructured{}
		must(t, yaml.Unmarshal(data, &obj.Object))
		obj.SetNamespace("t-validation")
		must(t, f.c.Create(ctx, obj, client.DryRunAll))
	})

	t.Run("replicas default to 1", func(t *testing.T) {
		obj := object("web", with("replicas", nil))
		must(t, f.c.Create(ctx, obj, client.DryRunAll))
		if r, _, _ := unstructured.NestedInt64(obj.Object, "spec", "replicas"); r != 1 {
			t.Errorf("replicas = %d, want 1", r)
		}
	})

	// Placement is immutable: a real object (deleted before any controller runs).
	t.Run("placement immutable", func(t *testing.T) {
		obj := object("placed", with("placement", map[string]any{"folder": "teams"}))
		must(t, f.c.Create(ctx, obj))
		defer func() { must(t, f.c.Delete(ctx, obj)) }()
		for _, change := range []struct {
			name      string
			placement any
		}{
			{"changed", map[string]any{"folder": "other"}},
			{"added field", map[string]any{"folder": "teams", "datastore": "ds1"}},
			{"removed", nil},
		} {
			upd := obj.DeepCopy()
			if change.placement == nil {
				unstructured.RemoveNestedField(upd.Object, "spec", "placement")
			} else {
				must(t, unstructured.SetNestedField(upd.Object, change.placement, "spec", "placement"))
			}
			err := f.c.Update(ctx, upd, client.DryRunAll)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "placement is immutable") {
				t.Errorf("%s: got %v; want the immutability message", change.name, err)
			}
		}
		// Other fields stay mutable, placement.antiAffinity among them.
		upd := obj.DeepCopy()
		must(t, unstructured.SetNestedField(upd.Object, int64(3), "spec", "cpu"))
		must(t, f.c.Update(ctx, upd, client.DryRunAll))
		must(t, unstructured.SetNestedField(upd.Object, "Required", "spec", "placement", "antiAffinity"))
		must(t, f.c.Update(ctx, upd, client.DryRunAll))
		must(t, unstructured.SetNestedField(upd.Object, "Sometimes", "spec", "placement", "antiAffinity"))
		if err := f.c.Update(ctx, upd, client.DryRunAll); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `Unsupported value: "Sometimes"`) {
			t.Errorf("antiAffinity Sometimes: got %v; want the enum refused", err)
		}
	})

	// A group without placement may get antiAffinity (and placement: {} is no placement).
	t.Run("antiAffinity added to a group without placement", func(t *testing.T) {
		obj := object("unplaced", validSpec())
		must(t, f.c.Create(ctx, obj))
		defer func() { must(t, f.c.Delete(ctx, obj)) }()
		upd := obj.DeepCopy()
		must(t, unstructured.SetNestedField(upd.Object, "Preferred", "spec", "placement", "antiAffinity"))
		must(t, f.c.Update(ctx, upd, client.DryRunAll))
		must(t, unstructured.SetNestedField(upd.Object, map[string]any{"antiAffinity": "Preferred", "datastore": "ds1"}, "spec", "placement"))
		if err := f.c.Update(ctx, upd, client.DryRunAll); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "placement is immutable") {
			t.Errorf("datastore added: got %v; want the immutability message", err)
		}
	})
}
