package mirror

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// CacheFailure is why a cache pod does not serve, read from its containers' statuses, or "" when
// nothing failed (it may still be starting). A container of the cache image that ends in failure
// leaves its reason as its termination message (quartermaster writes it to the kubelet's
// termination log): the storage init container refusing a volume it may not change, the cache
// refusing a volume it cannot write. The answer names the pod, its volume's claim and the message.
func CacheFailure(pod *corev1.Pod) string {
	var failures []string
	check := func(prefix string, statuses []corev1.ContainerStatus) {
		for _, s := range statuses {
			t := s.State.Terminated
			if t == nil || t.ExitCode == 0 {
				// Waiting to restart (CrashLoopBackOff) after a failed run: that run's end.
				if s.State.Waiting != nil && s.LastTerminationState.Terminated != nil && s.LastTerminationState.Terminated.ExitCode != 0 {
					t = s.LastTerminationState.Terminated
				} else {
					continue
				}
			}
			msg := strings.TrimSpace(t.Message)
			if msg == "" {
				msg = t.Reason
			}
			failures = append(failures, fmt.Sprintf("%scontainer %s exited %d: %s", prefix, s.Name, t.ExitCode, msg))
		}
	}
	check("init ", pod.Status.InitContainerStatuses)
	check("", pod.Status.ContainerStatuses)
	if len(failures) == 0 {
		return ""
	}
	where := "pod " + pod.Name
	for _, v := range pod.Spec.Volumes {
		if v.Name == cacheVolume && v.PersistentVolumeClaim != nil {
			where += " (volume " + cacheVolume + ", PersistentVolumeClaim " + v.PersistentVolumeClaim.ClaimName + ")"
		}
	}
	return where + ": " + strings.Join(failures, "; ")
}
