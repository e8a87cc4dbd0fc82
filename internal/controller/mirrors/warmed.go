package mirrors

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// What the cache pods hold of the pins: each ready cache pod notes it on its own Pod
// (mirror.CacheReport, through its ServiceAccount's one permission); the controller reads the
// notes into status.pinnedSize and the Warmed condition, and records a WarmFailed Event when the
// failures it shows change. A pod that is not ready is not read: its note may be from before it
// stopped. The pods' watch brings a reconcile when a note changes.

// pinsState is what warmedCondition reads: the pins the controller wrote, and the cache pods.
type pinsState struct {
	pinned int    // images pinned
	hash   string // mirror.PinsHash of the pins file written
	pods   []corev1.Pod
}

// cachePods are the mirror's cache pods, in name order.
func (r *Reconciler) cachePods(ctx context.Context, name string) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := r.objects.List(ctx, pods, client.InNamespace(r.install.Namespace),
		client.MatchingLabels{mirror.LabelMirror: name, mirror.LabelComponent: mirror.ComponentCache}); err != nil {
		return nil, err
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return pods.Items, nil
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// warmedCondition is the Warmed condition and status.pinnedSize the pods' notes give, or nil and
// nil when nothing is pinned (the condition is removed).
func warmedCondition(st pinsState) (*metav1.Condition, *resource.Quantity) {
	if st.pinned == 0 {
		return nil, nil
	}
	var (
		reported, stale, warming int
		most                     int64
		failed                   = map[string]string{}
		failedCount              int
		unreadable, over         []string
	)
	for i := range st.pods {
		pod := &st.pods[i]
		note, ok := pod.Annotations[mirror.AnnotationCacheReport]
		if !ok || !podReady(pod) {
			continue
		}
		rep, err := mirror.ParseCacheReport(note)
		if err != nil {
			unreadable = append(unreadable, pod.Name)
			continue
		}
		reported++
		most = max(most, rep.Bytes)
		if rep.OverHighWater {
			over = append(over, pod.Name)
		}
		if rep.PinsHash != st.hash {
			stale++
		}
		warming += rep.Warming
		failedCount += max(rep.FailedCount, len(rep.Failed))
		for _, f := range rep.Failed {
			if _, seen := failed[f.Image]; !seen {
				failed[f.Image] = f.Error
			}
		}
	}
	c := &metav1.Condition{Type: registryv1alpha1.ConditionWarmed}
	var size *resource.Quantity
	if reported > 0 {
		const mi = 1 << 20
		size = resource.NewQuantity((most+mi-1)/mi*mi, resource.BinarySI)
	}
	switch {
	case reported == 0:
		c.Status, c.Reason = metav1.ConditionUnknown, registryv1alpha1.ReasonNotReported
		c.Message = "no ready cache pod has noted what it holds of the pins yet"
		if len(unreadable) > 0 {
			c.Message = fmt.Sprintf("the notes of cache pods %s do not parse (%s)", strings.Join(unreadable, ", "), mirror.AnnotationCacheReport)
		}
	case len(failed) > 0:
		images := make([]string, 0, len(failed))
		for _, image := range slices.Sorted(maps.Keys(failed)) {
			images = append(images, image+": "+failed[image])
		}
		c.Status, c.Reason = metav1.ConditionFalse, registryv1alpha1.ReasonWarmFailed
		c.Message = fmt.Sprintf("%d pinned image(s) could not be fetched (the cache tries again every 5 minutes; pulls of them go to the upstream): %s",
			max(failedCount, len(failed)), strings.Join(images, "; "))
	case stale > 0:
		c.Status, c.Reason = metav1.ConditionFalse, registryv1alpha1.ReasonWarming
		c.Message = fmt.Sprintf("%d of %d ready cache pods have not read the current pins yet (their kubelets are asked to hand them the new file)", stale, reported)
	case warming > 0:
		c.Status, c.Reason = metav1.ConditionFalse, registryv1alpha1.ReasonWarming
		c.Message = fmt.Sprintf("fetching %d pinned image(s) before any node asks", warming)
	default:
		c.Status, c.Reason = metav1.ConditionTrue, registryv1alpha1.ReasonWarmed
		c.Message = fmt.Sprintf("the cache pods hold every one of the %d pinned image(s)", st.pinned)
	}
	if len(over) > 0 {
		c.Message += "; " + pinnedOverHighWater + " on cache pod(s) " + strings.Join(over, ", ") +
			": eviction cannot bring the volume under it (give the mirror a larger volume, spec.storage.size)"
	}
	return c, size
}

// pinnedOverHighWater says that pinned content alone fills a volume past its high-water mark.
const pinnedOverHighWater = "pinned content alone is above the high-water mark"

// observeWarmed sets the Warmed condition and status.pinnedSize from st, keeping the condition's
// place and transition time, and records a WarmFailed Event when the failures shown change.
func (r *Reconciler) observeWarmed(rm *registryv1alpha1.RegistryMirror, st pinsState) {
	c, size := warmedCondition(st)
	rm.Status.PinnedSize = size
	if c == nil {
		meta.RemoveStatusCondition(&rm.Status.Conditions, registryv1alpha1.ConditionWarmed)
		return
	}
	c.ObservedGeneration = rm.Generation
	was := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionWarmed)
	if c.Reason == registryv1alpha1.ReasonWarmFailed && (was == nil || was.Reason != c.Reason || was.Message != c.Message) {
		r.recorder.Eventf(rm, nil, corev1.EventTypeWarning, registryv1alpha1.ReasonWarmFailed, "Warm", "%s", c.Message)
	}
	if _, over, ok := strings.Cut(c.Message, pinnedOverHighWater); ok && (was == nil || !strings.Contains(was.Message, pinnedOverHighWater)) {
		r.recorder.Eventf(rm, nil, corev1.EventTypeWarning, "PinnedOverHighWater", "Evict", "%s%s", pinnedOverHighWater, over)
	}
	meta.SetStatusCondition(&rm.Status.Conditions, *c)
}

// A cache pod reads its pins from the mounted ConfigMap, which its kubelet refreshes when it syncs
// the pod: periodically (about a minute), and whenever the pod changes. So that new pins reach the
// caches before the Pods of a rollout ask, the controller changes each running cache pod that has
// not read the current pins: it sets AnnotationPinsRequested to "<pins hash>@<time>#<asks>". It
// asks again after pinsAskAgain while the pod's note still shows other pins (its kubelet's copy of
// the ConfigMap may have lagged behind the pod's change), pinsAsks times in all (the periodic sync
// comes by then), and once only of a pod that notes nothing (a cache that does not report).
const (
	AnnotationPinsRequested = "registry.quartermaster.dev/pins-requested"
	pinsAskAgain            = 15 * time.Second
	pinsAsks                = 3
)

// askForPins changes the cache pods that have not read the current pins, and says when to look
// again (0: no pod waits).
func (r *Reconciler) askForPins(ctx context.Context, st pinsState) (time.Duration, error) {
	var again time.Duration
	soonest := func(d time.Duration) {
		if d > 0 && (again == 0 || d < again) {
			again = d
		}
	}
	now := r.now()
	for i := range st.pods {
		pod := &st.pods[i]
		ask, wait := pinsAsk(pod, st.hash, now)
		soonest(wait)
		if ask == "" {
			continue
		}
		patch := client.MergeFrom(pod.DeepCopy())
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[AnnotationPinsRequested] = ask
		if err := r.objects.Patch(ctx, pod, patch); client.IgnoreNotFound(err) != nil {
			return 0, fmt.Errorf("asking cache pod %s's kubelet for the new pins: %w", pod.Name, err)
		}
	}
	return again, nil
}

// pinsAsk decides for one cache pod: the value of AnnotationPinsRequested to set now ("": none),
// and when to decide again (0: not for this pod).
func pinsAsk(pod *corev1.Pod, hash string, now time.Time) (ask string, wait time.Duration) {
	if pod.Status.Phase != corev1.PodRunning || !pod.DeletionTimestamp.IsZero() {
		return "", 0
	}
	note, reported := pod.Annotations[mirror.AnnotationCacheReport]
	if reported {
		if rep, err := mirror.ParseCacheReport(note); err == nil && rep.PinsHash == hash {
			return "", 0
		}
	}
	asked, at, asks := parsePinsRequested(pod.Annotations[AnnotationPinsRequested])
	if asked == hash {
		if !reported || asks >= pinsAsks {
			return "", 0
		}
		if since := now.Sub(at); since < pinsAskAgain {
			return "", pinsAskAgain - since
		}
	} else {
		asks = 0
	}
	if !reported || asks+1 >= pinsAsks {
		wait = 0
	} else {
		wait = pinsAskAgain
	}
	return fmt.Sprintf("%s@%s#%d", hash, now.UTC().Format(time.RFC3339), asks+1), wait
}

// parsePinsRequested reads AnnotationPinsRequested: the hash asked for, when, and how many times
// (zero values for what does not parse).
func parsePinsRequested(v string) (hash string, at time.Time, asks int) {
	hash, rest, _ := strings.Cut(v, "@")
	when, n, _ := strings.Cut(rest, "#")
	at, _ = time.Parse(time.RFC3339, when)
	asks, _ = strconv.Atoi(n)
	return hash, at, asks
}
