package mirrors

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// TestPinsAsk: the rule for asking a cache pod's kubelet for new pins (changing the pod makes the
// kubelet sync it, which refreshes its mounted ConfigMaps): a running pod whose note shows other
// pins is asked, again after pinsAskAgain while its note stays behind, pinsAsks times in all; a
// pod that notes nothing once; a pod that read the pins, or does not run, never.
func TestPinsAsk(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	const hash = "current"
	note := func(h string) string { return mirror.NewCacheReport(h, 1, 0, false, 0, nil).Annotation() }
	asked := func(h string, ago time.Duration, n int) string {
		return h + "@" + now.Add(-ago).Format(time.RFC3339) + "#" + string(rune('0'+n))
	}
	pod := func(phase corev1.PodPhase, annotations ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "mirror-hub-0", Annotations: map[string]string{}}, Status: corev1.PodStatus{Phase: phase}}
		for i := 0; i+1 < len(annotations); i += 2 {
			p.Annotations[annotations[i]] = annotations[i+1]
		}
		return p
	}
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		ask  string
		wait time.Duration
	}{
		{"read the current pins", pod(corev1.PodRunning, mirror.AnnotationCacheReport, note(hash)), "", 0},
		{"not running", pod(corev1.PodPending, mirror.AnnotationCacheReport, note("old")), "", 0},
		{"behind, never asked", pod(corev1.PodRunning, mirror.AnnotationCacheReport, note("old")), asked(hash, 0, 1), pinsAskAgain},
		{"behind, asked for older pins", pod(corev1.PodRunning, mirror.AnnotationCacheReport, note("old"), AnnotationPinsRequested, asked("old", time.Minute, 3)), asked(hash, 0, 1), pinsAskAgain},
		{"behind, asked 5 s ago", pod(corev1.PodRunning, mirror.AnnotationCacheReport, note("old"), AnnotationPinsRequested, asked(hash, 5*time.Second, 1)), "", 10 * time.Second},
		{"behind, asked 20 s ago", pod(corev1.PodRunning, mirror.AnnotationCacheReport, note("old"), AnnotationPinsRequested, asked(hash, 20*time.Second, 1)), asked(hash, 0, 2), pinsAskAgain},
		{"behind, the last ask", pod(corev1.PodRunning, mirror.AnnotationCacheReport, note("old"), AnnotationPinsRequested, asked(hash, 20*time.Second, 2)), asked(hash, 0, 3), 0},
		{"behind, asked enough", pod(corev1.PodRunning, mirror.AnnotationCacheReport, note("old"), AnnotationPinsRequested, asked(hash, time.Minute, 3)), "", 0},
		{"notes nothing, never asked", pod(corev1.PodRunning), asked(hash, 0, 1), 0},
		{"notes nothing, asked", pod(corev1.PodRunning, AnnotationPinsRequested, asked(hash, time.Minute, 1)), "", 0},
		{"a note that does not parse", pod(corev1.PodRunning, mirror.AnnotationCacheReport, "{", AnnotationPinsRequested, asked(hash, 20*time.Second, 1)), asked(hash, 0, 2), pinsAskAgain},
	} {
		t.Run(c.name, func(t *testing.T) {
			ask, wait := pinsAsk(c.pod, hash, now)
			if ask != c.ask || wait != c.wait {
				t.Errorf("pinsAsk = %q, %v; want %q, %v", ask, wait, c.ask, c.wait)
			}
		})
	}
}
