package intent

import (
	"strings"
	"testing"
)

// TestAppliedVerdict: what a parent's Ready says after an apply, the first of what holds it back
// winning, and every note in the message.
func TestAppliedVerdict(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		a          Applied
		unenforced []string
		readiness  Readiness
		reason     string
		message    string
	}{
		{"every policy in force", Applied{Entries: []string{"NetworkPolicy/a", "KyvernoPolicy/b"}}, nil,
			Enforced, "Generated", "2 engine policies"},
		{"an id no engine implements", Applied{Entries: []string{"NetworkPolicy/a"}}, []string{"netSegment"},
			Enforced, "Generated", "1 engine policies; no engine implements netSegment: nothing enforces it"},
		{"waiting for Kyverno", Applied{Entries: []string{"KyvernoPolicy/b"}, Pending: []string{"KyvernoPolicy/b (not ready)"}}, nil,
			WaitingForEngine, "WaitingForEngine", "waiting for their engine to accept KyvernoPolicy/b (not ready)"},
		{"an engine not installed", Applied{Missing: []Engine{KubeArmor}, Pending: []string{"KyvernoPolicy/b (x)"}}, nil,
			NeedsPerson, "EngineNotInstalled", "not installed (its policies are generated once it is): KubeArmor"},
		{"refused", Applied{Rejected: []string{"KyvernoPolicy/b: invalid"}, Missing: []Engine{KubeArmor}}, nil,
			NeedsPerson, "Rejected", "refused by the API server: KyvernoPolicy/b: invalid"},
		{"a conflict first", Applied{Conflicts: []string{"NetworkPolicy shop/a"}, Rejected: []string{"x"}}, nil,
			NeedsPerson, "Conflict", "NetworkPolicy shop/a exist and were not generated from this policy"},
		{"disabled and shadowed engines noted", Applied{Disabled: []Engine{Kyverno, K8TLS}, Shadowed: []string{"NetworkPolicy/a"}}, nil,
			Enforced, "Generated", "0 engine policies; disabled by --intents-engines: Kyverno, K8TLS; an earlier rule of the same intent id makes NetworkPolicy/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.a.Verdict(tc.unenforced)
			if v.Readiness != tc.readiness || v.Reason != tc.reason || !strings.Contains(v.Message, tc.message) {
				t.Errorf("verdict %+v, want %d %s saying %q", v, tc.readiness, tc.reason, tc.message)
			}
		})
	}
	if !(Applied{Changes: []string{"created NetworkPolicy a"}}).OnlyCreated() || (Applied{Changes: []string{"created NetworkPolicy a", "reverted KyvernoPolicy b"}}).OnlyCreated() {
		t.Error("OnlyCreated")
	}
}
