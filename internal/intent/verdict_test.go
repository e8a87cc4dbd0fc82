package intent

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func TestEngineVerdict(t *testing.T) {
	for _, tc := range []struct {
		name, obj string
		want      Verdict
		msg       string
	}{
		{"Kyverno has not looked yet", `{apiVersion: kyverno.io/v1, kind: Policy}`, Pending, ""},
		{"Kyverno accepted it", `{apiVersion: kyverno.io/v1, kind: ClusterPolicy, status: {conditions: [
			{type: Ready, status: "True", reason: Succeeded, message: Ready}]}}`, Accepted, "Ready"},
		{"Kyverno refused it", `{apiVersion: kyverno.io/v1, kind: Policy, status: {conditions: [
			{type: Ready, status: "False", reason: Failed, message: "failed to get GVR for kind security.kubearmor.com/v1/KubeArmorPolicy"}]}}`,
			Refused, "failed to get GVR for kind security.kubearmor.com/v1/KubeArmorPolicy"},
		{"an engine that reports nothing", `{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy}`, Accepted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(tc.obj), &u.Object); err != nil {
				t.Fatal(err)
			}
			if got, msg := EngineVerdict(u); got != tc.want || msg != tc.msg {
				t.Errorf("EngineVerdict = %v %q, want %v %q", got, msg, tc.want, tc.msg)
			}
		})
	}
}
