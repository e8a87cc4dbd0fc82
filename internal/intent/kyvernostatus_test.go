package intent

import (
	"encoding/json"
	"testing"
)

func TestKyvernoPolicyStatus(t *testing.T) {
	for _, tc := range []struct {
		name, status string
		ready        bool
		message      string
	}{
		{
			// Observed: a ClusterPolicy (one validate.podSecurity rule, failureAction Enforce)
			// once Kyverno v1.19.1 had registered its webhooks (TestKyvernoHarness logs it).
			name: "Ready, as Kyverno 1.19.1 writes it",
			status: `{"autogen":{},"conditions":[{"lastTransitionTime":"2026-11-25T18:11:17Z","message":"Ready","reason":"Succeeded",` +
				`"status":"True","type":"Ready"}],"rulecount":{"generate":0,"mutate":0,"validate":1,"verifyimages":0},` +
				`"validatingadmissionpolicy":{"generated":false,"message":"skip generating ValidatingAdmissionPolicy for non CEL rules."}}`,
			ready: true, message: "Ready",
		},
		{
			// What Kyverno 1.19's PolicyStatus.SetReady(false, "Not Ready") writes while the
			// policy's webhooks are not registered.
			name: "not ready while the webhooks are not registered",
			status: `{"autogen":{},"conditions":[{"lastTransitionTime":"2026-11-25T18:11:17Z","message":"Not Ready","reason":"Failed",` +
				`"status":"False","type":"Ready"}],"rulecount":{"generate":0,"mutate":0,"validate":1,"verifyimages":0}}`,
			message: "Failed: Not Ready",
		},
		{name: "no status yet", status: `null`, message: "Kyverno has not reported on the policy yet"},
		{name: "a status without either", status: `{"autogen":{},"rulecount":{"validate":1}}`, message: "Kyverno has not reported on the policy yet"},
		{name: "other conditions only", status: `{"conditions":[{"type":"Other","status":"True"}]}`, message: "Kyverno has not reported on the policy yet"},
		{name: "Kyverno before 1.9: ready", status: `{"ready":true}`, ready: true, message: "ready"},
		{name: "Kyverno before 1.9: not ready", status: `{"ready":false}`, message: "Kyverno reports the policy not ready"},
		{
			name:    "the condition wins over the deprecated field",
			status:  `{"ready":true,"conditions":[{"type":"Ready","status":"False","reason":"Failed","message":"Not Ready"}]}`,
			message: "Failed: Not Ready",
		},
		{name: "a False condition without words", status: `{"conditions":[{"type":"Ready","status":"False"}]}`, message: "Kyverno reports the policy not ready"},
		{name: "Unknown is not ready", status: `{"conditions":[{"type":"Ready","status":"Unknown","message":"checking"}]}`, message: "checking"},
		{name: "a malformed status", status: `"Ready"`, message: "Kyverno has not reported on the policy yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var status any
			if err := json.Unmarshal([]byte(tc.status), &status); err != nil {
				t.Fatal(err)
			}
			obj := map[string]any{"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "status": status}
			ready, message := KyvernoPolicyStatus(obj)
			if ready != tc.ready || message != tc.message {
				t.Errorf("KyvernoPolicyStatus = %v, %q; want %v, %q", ready, message, tc.ready, tc.message)
			}
		})
	}
}
