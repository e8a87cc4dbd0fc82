package intent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
)

// TestCheckException walks every check of an exception that needs no other object: each refusal
// names the failed check (and the flag that sets it), the first failed one wins, and an exception
// within the platform's rules passes.
func TestCheckException(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	now := created.Add(time.Hour)
	opts := ExceptionRules{Namespace: "kyverno-exceptions", MaxTTL: 72 * time.Hour, Warning: 24 * time.Hour, AdminNamespaces: []string{"platform"}}
	exc := func(ns string, expires time.Time, namespaces []string, selector metav1.LabelSelector) *securityv1alpha1.SecurityIntentException {
		return &securityv1alpha1.SecurityIntentException{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "e", CreationTimestamp: metav1.NewTime(created)},
			Spec: securityv1alpha1.SecurityIntentExceptionSpec{Intent: "escape", Owner: "team", Reason: "a vendor image",
				Expires: metav1.NewTime(expires), Workloads: securityv1alpha1.ExemptedWorkloads{Selector: selector, Namespaces: namespaces}},
		}
	}
	legacy := metav1.LabelSelector{MatchLabels: map[string]string{"legacy": "true"}}
	everything := metav1.LabelSelector{}
	for _, tc := range []struct {
		name   string
		exc    *securityv1alpha1.SecurityIntentException
		opts   func(*ExceptionRules)
		reason string // "" passes
		says   string
	}{
		{"within the rules", exc("shop", created.Add(48*time.Hour), nil, legacy), nil, "", ""},
		{"its own namespace named", exc("shop", created.Add(48*time.Hour), []string{"shop"}, everything), nil, "", ""},
		{"exceptions not enabled", exc("shop", created.Add(48*time.Hour), nil, legacy), func(o *ExceptionRules) { o.Namespace = "" }, "ExceptionsDisabled", "--intents-exception-namespace"},
		{"expired", exc("shop", now, nil, legacy), nil, "Expired", "expired at 2026-11-01T13:00:00Z (owner team)"},
		{"expired first of all", exc("shop", now.Add(-time.Second), []string{"*"}, everything), nil, "Expired", "expired at"},
		{"beyond the maximum", exc("shop", created.Add(72*time.Hour+time.Second), nil, legacy), nil, "ExpiryBeyondMaximum", "at most 72h0m0s after the exception's creation, 2026-11-04T12:00:00Z (--intents-exception-max-ttl)"},
		{"at the maximum", exc("shop", created.Add(72*time.Hour), nil, legacy), nil, "", ""},
		{"another namespace", exc("shop", created.Add(48*time.Hour), []string{"db"}, legacy), nil, "NamespaceNotAllowed", "made in a namespace the platform names (only platform, --intents-exception-admin-namespaces)"},
		{"every namespace", exc("shop", created.Add(48*time.Hour), []string{"*"}, legacy), nil, "NamespaceNotAllowed", "exempts only workloads of shop"},
		{"no admin namespace", exc("shop", created.Add(48*time.Hour), []string{"db"}, legacy), func(o *ExceptionRules) { o.AdminNamespaces = nil }, "NamespaceNotAllowed", "(no namespace,"},
		{"an admin namespace, another namespace", exc("platform", created.Add(48*time.Hour), []string{"db", "shop"}, everything), nil, "", ""},
		{"an admin namespace, every namespace by label", exc("platform", created.Add(48*time.Hour), []string{"*"}, legacy), nil, "", ""},
		{"everything", exc("platform", created.Add(48*time.Hour), []string{"*"}, everything), nil, "ExemptsEverything", "--intents-exception-allow-everything"},
		{"every namespace, selecting by the absence of a label", exc("platform", created.Add(48*time.Hour), []string{"*"},
			metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: metav1.LabelSelectorOpDoesNotExist}, {Key: "y", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"z"}}}}),
			nil, "ExemptsEverything", "requires no label"},
		{"every namespace, selecting by a label present", exc("platform", created.Add(48*time.Hour), []string{"*"},
			metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "legacy", Operator: metav1.LabelSelectorOpExists}}}), nil, "", ""},
		{"everything, allowed", exc("platform", created.Add(48*time.Hour), []string{"*"}, everything), func(o *ExceptionRules) { o.AllowEverything = true }, "", ""},
		{"a selector the API server cannot parse", exc("shop", created.Add(48*time.Hour), nil, metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}), nil, "InvalidSelector", "spec.workloads.selector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts
			if tc.opts != nil {
				tc.opts(&o)
			}
			got := CheckException(tc.exc, o, now)
			switch {
			case tc.reason == "" && got != nil:
				t.Errorf("refused: %s: %s", got.Reason, got.Message)
			case tc.reason != "" && got == nil:
				t.Errorf("passed; want %s", tc.reason)
			case tc.reason != "" && (got.Reason != tc.reason || !strings.Contains(got.Message, tc.says)):
				t.Errorf("refused %s: %s; want %s saying %q", got.Reason, got.Message, tc.reason, tc.says)
			}
		})
	}
}

// TestPolicyExceptionShape: the PolicyException always names the namespaces (Kyverno matches
// nothing by an empty filter; "*" is its wildcard), and a selector only when it requires something.
func TestPolicyExceptionShape(t *testing.T) {
	t.Parallel()
	policies := []string{"csib-escapetohost"}
	for _, tc := range []struct {
		namespaces []string
		selector   metav1.LabelSelector
		want       string
	}{
		{[]string{"*"}, metav1.LabelSelector{}, "map[namespaces:[*]]"},
		{nil, metav1.LabelSelector{}, "map[namespaces:[shop]]"},
		{[]string{"a", "b"}, metav1.LabelSelector{MatchLabels: map[string]string{"legacy": "true"}}, "map[namespaces:[a b] selector:map[matchLabels:map[legacy:true]]]"},
	} {
		exc := &securityv1alpha1.SecurityIntentException{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "e"},
			Spec: securityv1alpha1.SecurityIntentExceptionSpec{Workloads: securityv1alpha1.ExemptedWorkloads{Namespaces: tc.namespaces, Selector: tc.selector}}}
		pe, err := PolicyException(exc, "kyverno", policies)
		if err != nil {
			t.Fatal(err)
		}
		if pe.GetNamespace() != "kyverno" || pe.GetName() != "shop.e" || pe.GetAnnotations()[ExceptionAnnotation] != "shop/e" {
			t.Errorf("PolicyException %s/%s, annotations %v", pe.GetNamespace(), pe.GetName(), pe.GetAnnotations())
		}
		if ex, _, _ := unstructured.NestedSlice(pe.Object, "spec", "exceptions"); fmt.Sprint(ex) != "[map[policyName:csib-escapetohost ruleNames:[*]]]" {
			t.Errorf("exceptions %v", ex)
		}
		res, _, _ := unstructured.NestedSlice(pe.Object, "spec", "match", "any")
		if got := fmt.Sprint(res[0].(map[string]any)["resources"]); got != tc.want {
			t.Errorf("namespaces %v, selector %v: resources %s, want %s", tc.namespaces, tc.selector, got, tc.want)
		}
	}
}

// TestPolicyExceptionName: one name per exception, a valid object name however long its parts.
func TestPolicyExceptionName(t *testing.T) {
	t.Parallel()
	if got := PolicyExceptionName("shop", "legacy.v1"); got != "shop.legacy.v1" {
		t.Errorf("got %q", got)
	}
	long := strings.Repeat("a", 253)
	a, b := PolicyExceptionName("shop", long), PolicyExceptionName("shop", long[:252]+"b")
	if len(a) > 253 || len(b) > 253 || a == b || strings.HasSuffix(a[:237], ".") {
		t.Errorf("long names: %q (%d), %q (%d)", a, len(a), b, len(b))
	}
}

// TestCheckExceptionIntent: only an intent Kyverno validates (and scans) can be exempted from;
// the refusal says what enforces the others.
func TestCheckExceptionIntent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id                  string
		refused             string // in the message; "" when accepted
		namespaced, cluster bool
	}{
		{EscapeToHost, "", true, true},
		{DNSManipulation, "is enforced by KubeArmor, NetworkPolicy, which has no exception of its own", false, false},
		{CocoWorkload, "has Kyverno policies that mutate or generate rather than validate", true, true},
		{"netSegment", "is enforced by no engine", false, false},
	} {
		ref, namespaced, cluster := CheckExceptionIntent("si", tc.id)
		switch {
		case tc.refused == "" && ref != nil, tc.refused != "" && (ref == nil || ref.Reason != "NoEngineException" || !strings.Contains(ref.Message, tc.refused)):
			t.Errorf("%s: refusal %+v, want one saying %q", tc.id, ref, tc.refused)
		case namespaced != tc.namespaced || cluster != tc.cluster:
			t.Errorf("%s: Kyverno namespaced %v, cluster %v", tc.id, namespaced, cluster)
		}
	}
}
