package intent

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// reportOf is a Kyverno report of one Pod with one result per policy key given (key=outcome, or
// key=skip:exceptions), compacted as the report cache holds it.
func reportOf(namespace, pod string, results ...string) unstructured.Unstructured {
	var rs []any
	for _, r := range results {
		key, outcome, _ := strings.Cut(r, "=")
		res := map[string]any{"policy": key, "rule": "r", "result": outcome, "message": "because " + pod}
		if ex, ok := strings.CutPrefix(outcome, "skip:"); ok {
			res["result"], res["properties"] = "skip", map[string]any{"exceptions": ex}
		}
		rs = append(rs, res)
	}
	return *CompactReport(&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "PolicyReport",
		"metadata": map[string]any{"name": pod, "namespace": namespace},
		"scope":    map[string]any{"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod},
		"results":  rs,
	}})
}

// TestImpact: an impact from inputs and reports, in every state it can have.
func TestImpact(t *testing.T) {
	t.Parallel()
	web, webKind, webParent := KyvernoPolicyOf("shop", "web-escapetohost")
	all, allKind, allParent := KyvernoPolicyOf("", "all-escapetohost")
	if web.Key != "shop/web-escapetohost" || web.Entry != "KyvernoPolicy/web-escapetohost" || webKind != KyvernoPolicyKind || webParent != "NimbusPolicy" ||
		all.Key != "all-escapetohost" || all.Entry != "KyvernoClusterPolicy/all-escapetohost" || allKind != KyvernoClusterPolicyKind || allParent != "ClusterNimbusPolicy" {
		t.Fatalf("KyvernoPolicyOf: %+v %v %s, %+v %v %s", web, webKind, webParent, all, allKind, allParent)
	}
	reports := map[string][]unstructured.Unstructured{
		web.Key: {
			reportOf("shop", "web-1", web.Key+"=fail", all.Key+"=fail"),
			reportOf("shop", "web-2", web.Key+"=pass"),
			reportOf("shop", "web-3", web.Key+"=skip:shop.legacy"),
		},
		all.Key: {
			reportOf("shop", "web-1", web.Key+"=fail", all.Key+"=fail"),
			reportOf("other", "db-0", all.Key+"=error"),
		},
	}
	read := func(key string) ([]unstructured.Unstructured, error) {
		if key == "" {
			return nil, errors.New("no key")
		}
		return reports[key], nil
	}
	unscanned := ImpactInputs{}
	unscanned.AddUnscanned(DNSManipulation)
	unscanned.AddUnscanned(DNSManipulation) // noted once
	for _, tc := range []struct {
		name       string
		in         ImpactInputs
		state      string
		message    string
		violations int32
		violating  []string // namespace/name policy
	}{
		{name: "nothing scanned or unscanned", in: ImpactInputs{Readable: true}},
		{name: "only unscanned intents", in: unscanned, state: intentv1alpha1.ImpactNotScanned,
			message: "dnsManipulation (KubeArmor, NetworkPolicy) act on what runs from now on and report nothing on existing workloads"},
		{name: "reports unreadable", in: ImpactInputs{Why: "Kyverno is not installed", Policies: []ScannedPolicy{web}, Unscanned: unscanned.Unscanned},
			state: intentv1alpha1.ImpactUnknown, message: "Kyverno is not installed; not scanned: dnsManipulation (KubeArmor, NetworkPolicy)"},
		{name: "a policy not written yet", in: ImpactInputs{Readable: true, Policies: []ScannedPolicy{all}, Pending: []string{web.Entry}},
			state: intentv1alpha1.ImpactUnknown, message: "not written yet: KyvernoPolicy/web-escapetohost"},
		{name: "one policy", in: ImpactInputs{Readable: true, Policies: []ScannedPolicy{web}}, state: intentv1alpha1.ImpactCurrent,
			message: "Kyverno's reports: 1 of 3 scanned workloads fail KyvernoPolicy/web-escapetohost", violations: 1,
			violating: []string{"shop/web-1 KyvernoPolicy/web-escapetohost"}},
		{name: "two policies: a workload failing both counts once", in: ImpactInputs{Readable: true, Policies: []ScannedPolicy{web, all}},
			state: intentv1alpha1.ImpactCurrent, violations: 2,
			message:   "Kyverno's reports: 2 of 4 scanned workloads fail KyvernoClusterPolicy/all-escapetohost, KyvernoPolicy/web-escapetohost",
			violating: []string{"other/db-0 KyvernoClusterPolicy/all-escapetohost", "shop/web-1 KyvernoPolicy/web-escapetohost"}},
		{name: "a policy no report names", in: ImpactInputs{Readable: true, Policies: []ScannedPolicy{{Key: "shop/new", Entry: "KyvernoPolicy/new"}}},
			state: intentv1alpha1.ImpactCurrent, message: "0 of 0 scanned workloads fail KyvernoPolicy/new; no report names KyvernoPolicy/new yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			imp, err := Impact(tc.in, read)
			if err != nil {
				t.Fatal(err)
			}
			if tc.state == "" {
				if imp != nil {
					t.Fatalf("impact %+v, want none", imp)
				}
				return
			}
			if imp == nil || imp.State != tc.state || !strings.Contains(imp.Message, tc.message) {
				t.Fatalf("impact %+v, want %s saying %q", imp, tc.state, tc.message)
			}
			if counted := imp.Violations != nil && imp.Scanned != nil; counted != (tc.state == intentv1alpha1.ImpactCurrent) {
				t.Errorf("counts %v/%v in state %s", imp.Violations, imp.Scanned, imp.State)
			}
			if imp.Violations != nil && *imp.Violations != tc.violations {
				t.Errorf("violations %d, want %d", *imp.Violations, tc.violations)
			}
			var got []string
			for _, w := range imp.Violating {
				got = append(got, w.Namespace+"/"+w.Name+" "+w.Policy)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.violating) {
				t.Errorf("violating %v, want %v", got, tc.violating)
			}
		})
	}
	t.Run("a report read that fails", func(t *testing.T) {
		boom := errors.New("cache not synced")
		if _, err := Impact(ImpactInputs{Readable: true, Policies: []ScannedPolicy{web}}, func(string) ([]unstructured.Unstructured, error) { return nil, boom }); !errors.Is(err, boom) {
			t.Errorf("error %v, want %v", err, boom)
		}
	})
}

// TestExempted counts the workloads skipped under one exception, once each.
func TestExempted(t *testing.T) {
	t.Parallel()
	reports := map[string][]unstructured.Unstructured{
		"shop/a": {reportOf("shop", "w-1", "shop/a=skip:shop.legacy"), reportOf("shop", "w-2", "shop/a=skip:other,shop.legacy"),
			reportOf("shop", "w-3", "shop/a=skip:other"), reportOf("shop", "w-4", "shop/a=fail")},
		"b": {reportOf("shop", "w-1", "b=skip:shop.legacy")},
	}
	n, err := Exempted([]ScannedPolicy{{Key: "shop/a"}, {Key: "b"}}, "shop.legacy", func(key string) ([]unstructured.Unstructured, error) { return reports[key], nil })
	if err != nil || n != 2 {
		t.Errorf("Exempted: %d, %v; want 2 (w-1 under both policies once, w-2 under a list of exceptions)", n, err)
	}
}

// FuzzImpact makes an impact of arbitrary reports (whoever may write reports writes what it
// reads): never a panic, never more violating workloads than scanned ones, never more listed
// than the API allows.
func FuzzImpact(f *testing.F) {
	seed, _ := json.Marshal(kyvernoReport().Object)
	f.Add(seed, "shop/web-escapetohost")
	f.Add([]byte(`{"scope":{"name":1},"results":[{"policy":"p","result":"fail"},{"policy":"p","result":"error"}]}`), "p")
	f.Fuzz(func(t *testing.T, data []byte, key string) {
		obj := map[string]any{}
		if json.Unmarshal(data, &obj) != nil {
			return
		}
		u := *CompactReport(&unstructured.Unstructured{Object: obj})
		reports := []unstructured.Unstructured{u, u}
		imp, err := Impact(ImpactInputs{Readable: true, Policies: []ScannedPolicy{{Key: key, Entry: "KyvernoPolicy/x"}}},
			func(string) ([]unstructured.Unstructured, error) { return reports, nil })
		if err != nil || imp == nil || imp.Violations == nil || imp.Scanned == nil {
			t.Fatalf("impact %+v, %v", imp, err)
		}
		if *imp.Violations > *imp.Scanned || *imp.Scanned > 1 || len(imp.Violating) > intentv1alpha1.MaxImpactedWorkloads {
			t.Errorf("impact %+v", imp)
		}
		if _, err := Exempted([]ScannedPolicy{{Key: key}}, "e", func(string) ([]unstructured.Unstructured, error) { return reports, nil }); err != nil {
			t.Error(err)
		}
	})
}
