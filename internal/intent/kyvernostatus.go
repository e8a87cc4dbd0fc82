package intent

import "fmt"

// KyvernoPolicyStatus reads whether Kyverno has put a kyverno.io Policy or ClusterPolicy in force,
// from the object as the API server returns it (unstructured content).
//
// Kyverno 1.19 writes status.conditions[type=Ready] (reason Succeeded, message "Ready", once the
// policy's webhooks are registered; status False, reason Failed, message "Not Ready" while they
// are not) and clears the deprecated status.ready; Kyverno before 1.9 wrote only status.ready. The
// condition wins when both are present. A policy Kyverno has not looked at yet (no status, or a
// status without either) is not ready, with a message saying so. Kyverno sets no
// observedGeneration on the condition, so a Ready read just after an edit may describe the policy
// before it.
func KyvernoPolicyStatus(obj map[string]any) (ready bool, message string) {
	status, _ := obj["status"].(map[string]any)
	conditions, _ := status["conditions"].([]any)
	for _, c := range conditions {
		cond, _ := c.(map[string]any)
		if cond["type"] != "Ready" {
			continue
		}
		msg, _ := cond["message"].(string)
		reason, _ := cond["reason"].(string)
		if cond["status"] == "True" {
			return true, msg
		}
		switch {
		case reason != "" && msg != "":
			return false, fmt.Sprintf("%s: %s", reason, msg)
		case msg != "":
			return false, msg
		case reason != "":
			return false, reason
		}
		return false, "Kyverno reports the policy not ready"
	}
	if r, ok := status["ready"].(bool); ok {
		if r {
			return true, "ready"
		}
		return false, "Kyverno reports the policy not ready"
	}
	return false, "Kyverno has not reported on the policy yet"
}
