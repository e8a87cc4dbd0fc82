package status

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestResult(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name     string
		o        Outcome
		err      error
		min, max time.Duration
	}{
		{"healthy: jittered resync", Healthy("Synced", "ok", time.Hour), nil, time.Hour, time.Hour + 6*time.Minute},
		{"healthy without resync", Healthy("Synced", "ok", 0), nil, 0, 0},
		{"progressing", Progressing("Cloning", "2/5", time.Second), nil, time.Second, time.Second},
		{"transient: backoff", Transient("VCenterError", "down", boom), boom, 0, 0},
		{"waits for a person: slow retry", WaitsForPerson("TemplateNotFound", "no template", 5*time.Minute), nil, 5 * time.Minute, 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tc.o.Result()
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("error %v, want %v", err, tc.err)
			}
			if res.RequeueAfter < tc.min || res.RequeueAfter > tc.max {
				t.Errorf("RequeueAfter %v, want in [%v, %v]", res.RequeueAfter, tc.min, tc.max)
			}
			if err != nil && res != (reconcile.Result{}) {
				t.Errorf("result %+v with an error: controller-runtime ignores it", res)
			}
		})
	}
}

func TestSetConditions(t *testing.T) {
	t.Parallel()
	type want struct{ ready, reconciling, stalled metav1.ConditionStatus }
	const absent = metav1.ConditionStatus("")
	for _, tc := range []struct {
		name string
		o    Outcome
		want want
	}{
		{"healthy", Healthy("Synced", "in sync", time.Hour), want{metav1.ConditionTrue, absent, absent}},
		{"progressing", Progressing("Cloning", "2/5 VMs", time.Second), want{metav1.ConditionFalse, metav1.ConditionTrue, absent}},
		{"transient", Transient("AWSUnavailable", "throttled", errors.New("x")), want{metav1.ConditionFalse, metav1.ConditionTrue, absent}},
		{"stalled", WaitsForPerson("Conflict", "not ours", time.Minute), want{metav1.ConditionFalse, absent, metav1.ConditionTrue}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Start from the opposite state, so every condition must be set or removed.
			conds := []metav1.Condition{
				{Type: Ready, Status: metav1.ConditionFalse, Reason: "Old"},
				{Type: Reconciling, Status: metav1.ConditionTrue, Reason: "Old"},
				{Type: Stalled, Status: metav1.ConditionTrue, Reason: "Old"},
			}
			SetConditions(&conds, 7, tc.o)
			got := want{statusOf(conds, Ready), statusOf(conds, Reconciling), statusOf(conds, Stalled)}
			if got != tc.want {
				t.Errorf("Ready/Reconciling/Stalled = %v, want %v", got, tc.want)
			}
			for _, c := range conds {
				if c.Reason != tc.o.Reason || c.Message != tc.o.Message || c.ObservedGeneration != 7 {
					t.Errorf("%s = %s %q gen %d, want %s %q gen 7", c.Type, c.Reason, c.Message, c.ObservedGeneration, tc.o.Reason, tc.o.Message)
				}
			}
		})
	}
}

func statusOf(conds []metav1.Condition, t string) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(conds, t); c != nil {
		return c.Status
	}
	return ""
}

func TestConcludeAnnouncesTransitionsOnly(t *testing.T) {
	t.Parallel()
	rec := events.NewFakeRecorder(10)
	obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
	var conds []metav1.Condition
	var observed int64
	step := Step{Recorder: rec}
	steps := []struct {
		o    Outcome
		want string // the Event, "" for none
	}{
		{Progressing("PolicyNotReady", "waiting", time.Second), "Warning PolicyNotReady"},
		{Progressing("PolicyNotReady", "still waiting", time.Second), ""}, // a retry, same reason
		{Healthy("Synced", "in sync", time.Hour), "Normal Synced"},
		{Healthy("Synced", "in sync", time.Hour), ""},
		{Transient("AWSUnavailable", "throttled", errors.New("x")), "Warning AWSUnavailable"},
		{Healthy("Synced", "updated", time.Hour).Silenced(), ""}, // the reconcile said what it did
		{WaitsForPerson("Conflict", "not ours", time.Minute), "Warning Conflict"},
		{Outcome{Reason: "Expired", Message: "ttl passed", EventType: "Normal"}, "Normal Expired"},
	}
	for i, s := range steps {
		step.Conclude(obj, Reported{Conditions: &conds, ObservedGeneration: &observed}, s.o)
		if observed != 3 || meta.FindStatusCondition(conds, Ready).ObservedGeneration != 3 {
			t.Errorf("step %d: observedGeneration %d, the Ready condition's %d; want the object's 3", i, observed, meta.FindStatusCondition(conds, Ready).ObservedGeneration)
		}
		got := ""
		select {
		case e := <-rec.Events:
			got = strings.Join(strings.Fields(e)[:2], " ")
		default:
		}
		if got != s.want {
			t.Errorf("step %d (%s): Event %q, want %q", i, s.o.Reason, got, s.want)
		}
	}
}

func TestValidReason(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{"Synced": true, "NoSuchEntity": true, "Throttling:Rate": true, "": false, "404": false, "bad reason": false} {
		if got := ValidReason(s); got != want {
			t.Errorf("ValidReason(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestTruncateKeepsEventsWithinTheAPILimit(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 600) // 1200 bytes, two per rune
	got := Truncate(long, MaxEventNote)
	if len(got) > MaxEventNote || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("Truncate: %d bytes, valid %v, ends %q", len(got), utf8.ValidString(got), got[len(got)-3:])
	}
	if Truncate("short", MaxEventNote) != "short" {
		t.Error("a short note changed")
	}
}
