package mirrors

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const pinDigest = "sha256:00000000000000000000000000000000000000000000000000000000000000aa"

func podTemplate(image string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
	}
}

// The images the cluster's Pods and workload templates name through the mirror's host are its
// pins: a Deployment scaled to zero, a CronJob, a Pod by digest with an init container; not an
// image of another host, not an ended Pod's. A reference that goes stays pinned for the mirror's
// ttl, then goes; the status counts them.
func testPinnedByUse(t *testing.T, f *fixture) {
	ctx := context.Background()
	const host = "registry.pins.example"
	rm := mirrorOf("pins", f.open, host)
	rm.Spec.TTL = &metav1.Duration{Duration: 3 * time.Second}
	// What the cluster must start cold, by reference as a Pod names it: pinned for as long as it
	// is listed; an image of another host is ignored, and said.
	rm.Spec.Prefetch = []string{host + "/addons/dns:1.2", "quay.io/addons/metrics:v3", host + "/team/app@" + pinDigest}
	// The cluster's nodes: two platforms (and a node without the labels, which adds none).
	for name, arch := range map[string]string{"node-amd64": "amd64", "node-arm64": "arm64", "node-arm64-b": "arm64", "node-unlabelled": ""} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelOSStable: "linux", corev1.LabelArchStable: arch}}}
		if arch == "" {
			node.Labels = nil
		}
		f.create(t, node)
	}
	f.create(t, rm)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pins-workloads"}}
	f.create(t, ns)

	zero := int32(0)
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "scaled-to-zero", Namespace: ns.Name},
		Spec: appsv1.DeploymentSpec{Replicas: &zero, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
			Template: podTemplate(host + "/team/app:v1")},
	}
	cron := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns.Name},
		Spec: batchv1.CronJobSpec{Schedule: "0 3 * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: func() corev1.PodTemplateSpec {
			p := podTemplate(host + "/batch/report")
			p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
			return p
		}()}}},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "by-digest", Namespace: ns.Name},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "init", Image: host + "/team/init:v2"}},
			Containers:     []corev1.Container{{Name: "c", Image: host + "/team/web:v3@" + pinDigest}, {Name: "other", Image: "quay.io/prometheus/busybox:latest"}},
		},
	}
	done := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "done", Namespace: ns.Name},
		Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: host + "/team/done:v1"}}},
	}
	for _, obj := range []client.Object{deploy, cron, pod, done} {
		f.create(t, obj)
	}
	done.Status.Phase = corev1.PodSucceeded
	must(t, f.c.Status().Update(ctx, done))

	inUse := []string{"addons/dns:1.2", "batch/report:latest", "team/app:v1", "team/app@" + pinDigest, "team/init:v2", "team/web@" + pinDigest}
	pins := func() mirror.Pins {
		cm := &corev1.ConfigMap{}
		f.object(t, mirror.PinsName("pins"), cm)
		p, err := mirror.ParsePins([]byte(cm.Data[mirror.PinsFile]))
		must(t, err)
		return p
	}
	cm := &corev1.ConfigMap{}
	f.waitObject(t, mirror.PinsName("pins"), cm, func() (bool, string) {
		p, err := mirror.ParsePins([]byte(cm.Data[mirror.PinsFile]))
		if err != nil {
			return false, err.Error()
		}
		return slices.Equal(p.Refs(), inUse) && slices.Equal(p.Platforms, []string{"linux/amd64", "linux/arm64"}),
			strings.Join(p.Refs(), " ") + " for " + strings.Join(p.Platforms, " ")
	})
	for ref, until := range pins().Images {
		if until != "" {
			t.Errorf("%s in use has an end %q", ref, until)
		}
	}
	if ref := metav1.GetControllerOf(cm); ref == nil || ref.Name != "pins" || cm.Labels[mirror.LabelMirror] != "pins" {
		t.Errorf("the pins ConfigMap's owner %+v, labels %v", ref, cm.Labels)
	}
	got := f.waitMirror(t, "pins", ReasonStarting, func(rm *registryv1alpha1.RegistryMirror) (bool, string) {
		return rm.Status.PinnedImages == int32(len(inUse)), fmt.Sprintf("status.pinnedImages %d, want %d", rm.Status.PinnedImages, len(inUse))
	})
	if msg := meta.FindStatusCondition(got.Status.Conditions, registryv1alpha1.ConditionReady).Message; !strings.Contains(msg,
		"prefetch ignores quay.io/addons/metrics:v3: not pulled through "+host) {
		t.Errorf("the Ready message does not say which prefetch entry is ignored: %q", msg)
	}
	sts := &appsv1.StatefulSet{}
	f.object(t, mirror.CacheName("pins"), sts)
	if args := strings.Join(sts.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--pins="+mirror.PinsDir+"/"+mirror.PinsFile) {
		t.Errorf("the cache is not given its pins: %s", args)
	}

	// The cache container alone mounts the caches' ServiceAccount's token, never the storage init
	// container, which runs as root.
	mountsToken := func(c corev1.Container) bool {
		return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == mirror.APITokenDir })
	}
	if spec := sts.Spec.Template.Spec; spec.ServiceAccountName != "quartermaster-mirror-cache" || ptr.Deref(spec.AutomountServiceAccountToken, true) ||
		!slices.Contains(spec.Containers[0].Args, "--report-to-pod") || !mountsToken(spec.Containers[0]) || slices.ContainsFunc(spec.InitContainers, mountsToken) {
		t.Errorf("the cache pods do not note their pins on their Pods as the caches' ServiceAccount, from the cache container alone: %s, automount %v, args %q",
			spec.ServiceAccountName, spec.AutomountServiceAccountToken, spec.Containers[0].Args)
	}
	testWarmedFromTheCachePods(t, f, sts, mirror.PinsHash([]byte(cm.Data[mirror.PinsFile])), len(inUse))

	// The Deployment goes: its image stays pinned for the ttl, with its end, then goes.
	must(t, f.c.Delete(ctx, deploy))
	f.waitObject(t, mirror.PinsName("pins"), cm, func() (bool, string) {
		p, _ := mirror.ParsePins([]byte(cm.Data[mirror.PinsFile]))
		return p.Images["team/app:v1"] != "", cm.Data[mirror.PinsFile]
	})
	end, err := time.Parse(time.RFC3339, pins().Images["team/app:v1"])
	if err != nil || time.Until(end) > 4*time.Second {
		t.Errorf("the pin's end %v (%v), want within the 3 s ttl", end, err)
	}
	f.waitObject(t, mirror.PinsName("pins"), cm, func() (bool, string) {
		p, _ := mirror.ParsePins([]byte(cm.Data[mirror.PinsFile]))
		_, still := p.Images["team/app:v1"]
		return !still && len(p.Images) == len(inUse)-1, cm.Data[mirror.PinsFile]
	})

	// A Pod that ends releases its images at once into their ttl; so does its deletion.
	pod.Status.Phase = corev1.PodFailed
	must(t, f.c.Status().Update(ctx, pod))
	f.waitObject(t, mirror.PinsName("pins"), cm, func() (bool, string) {
		p, _ := mirror.ParsePins([]byte(cm.Data[mirror.PinsFile]))
		return p.Images["team/init:v2"] != "" && p.Images["team/web@"+pinDigest] != "", cm.Data[mirror.PinsFile]
	})
	if p := pins(); p.Images["batch/report:latest"] != "" {
		t.Errorf("the CronJob's image, still in use, has an end: %v", p.Images)
	}

	// A manager restart: the pins stay as they are until the new manager's caches know every
	// workload (nothing is released for a workload it has not seen yet), and a workload deleted
	// while no manager ran starts its ttl when the new one writes.
	f.stop(t)
	must(t, f.c.Delete(ctx, cron))
	f.run(t)
	f.waitObject(t, mirror.PinsName("pins"), cm, func() (bool, string) {
		p, _ := mirror.ParsePins([]byte(cm.Data[mirror.PinsFile]))
		return p.Images["batch/report:latest"] != "", cm.Data[mirror.PinsFile]
	})

	// The arm64 nodes go: the pins name amd64 alone.
	for _, name := range []string{"node-arm64", "node-arm64-b"} {
		must(t, f.c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	}
	f.waitObject(t, mirror.PinsName("pins"), cm, func() (bool, string) {
		p, _ := mirror.ParsePins([]byte(cm.Data[mirror.PinsFile]))
		return slices.Equal(p.Platforms, []string{"linux/amd64"}), cm.Data[mirror.PinsFile]
	})
}

// testWarmedFromTheCachePods plays the cache pods (envtest runs none): each ready one notes what it
// holds of the pins on its Pod, and the mirror's Warmed condition and status.pinnedSize follow
// their notes: Warming while a pod has not read the current pins or fetches some, WarmFailed
// naming the image and the upstream's answer (with a Warning Event), Warmed once every pod holds
// what it owns; a pod that is not ready is not read.
func testWarmedFromTheCachePods(t *testing.T, f *fixture, sts *appsv1.StatefulSet, hash string, pinned int) {
	ctx := context.Background()
	pods := make([]*corev1.Pod, 3)
	for i := range pods {
		pods[i] = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: fmt.Sprintf("%s-%d", sts.Name, i), Labels: sts.Spec.Template.Labels},
			Spec:       *sts.Spec.Template.Spec.DeepCopy(),
		}
		pods[i].Spec.Volumes = append(pods[i].Spec.Volumes, corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: mirror.PVCName("pins", i)},
		}})
		f.create(t, pods[i])
		// The third pod is not ready (not running): its note, however bad, is not read, and its
		// kubelet is not asked for the pins.
		pods[i].Status.Phase = corev1.PodRunning
		pods[i].Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if i == 2 {
			pods[i].Status.Phase = corev1.PodPending
			pods[i].Status.Conditions[0].Status = corev1.ConditionFalse
		}
		must(t, f.c.Status().Update(ctx, pods[i]))
	}
	defer func() {
		for _, pod := range pods {
			must(t, client.IgnoreNotFound(f.c.Delete(ctx, pod)))
		}
	}()
	note := func(pod *corev1.Pod, r mirror.CacheReport) {
		f.patch(t, pod, func() { pod.Annotations = map[string]string{mirror.AnnotationCacheReport: r.Annotation()} })
	}
	note(pods[2], mirror.NewCacheReport(hash, pinned, 1<<40, true, 0, []mirror.WarmFailure{{Image: "team/ghost:v1", Error: "not read"}}))
	warmed := func(reason, message string, size string) *registryv1alpha1.RegistryMirror {
		t.Helper()
		return f.waitMirror(t, "pins", ReasonStarting, func(rm *registryv1alpha1.RegistryMirror) (bool, string) {
			c := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionWarmed)
			got := ""
			if rm.Status.PinnedSize != nil {
				got = rm.Status.PinnedSize.String()
			}
			if c == nil {
				return false, "no Warmed condition, pinnedSize " + got
			}
			return c.Reason == reason && strings.Contains(c.Message, message) && got == size, fmt.Sprintf("Warmed %s %s: %q, pinnedSize %q", c.Status, c.Reason, c.Message, got)
		})
	}
	warmed(registryv1alpha1.ReasonNotReported, "no ready cache pod has noted", "")

	// One pod has not read the current pins yet; the other fetches two of its own.
	note(pods[0], mirror.NewCacheReport("0123456789abcdef", pinned-1, 10<<20, false, 0, nil))
	note(pods[1], mirror.NewCacheReport(hash, pinned, 20<<20, false, 2, nil))
	warmed(registryv1alpha1.ReasonWarming, "1 of 2 ready cache pods have not read the current pins", "20Mi")
	// The pod behind is changed, so that its kubelet hands it the pins at once; the others are not.
	f.waitObject(t, pods[0].Name, pods[0], func() (bool, string) {
		v := pods[0].Annotations[AnnotationPinsRequested]
		return strings.HasPrefix(v, hash+"@") && strings.HasSuffix(v, "#1"), v
	})
	for _, pod := range pods[1:] {
		f.object(t, pod.Name, pod)
		if v, asked := pod.Annotations[AnnotationPinsRequested]; asked {
			t.Errorf("pod %s, which read the pins or does not run, was asked for them: %q", pod.Name, v)
		}
	}
	note(pods[0], mirror.NewCacheReport(hash, pinned, 38_000_000, false, 0, nil))
	warmed(registryv1alpha1.ReasonWarming, "fetching 2 pinned image(s)", "37Mi")

	// A fetch fails: the image and the upstream's answer, once as an Event.
	const refusal = "GET /v2/team/app/manifests/v1: 404 manifest unknown"
	note(pods[1], mirror.NewCacheReport(hash, pinned, 20<<20, false, 1, []mirror.WarmFailure{{Image: "team/app:v1", Error: refusal}}))
	rm := warmed(registryv1alpha1.ReasonWarmFailed, "1 pinned image(s) could not be fetched", "37Mi")
	if c := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionWarmed); c.Status != metav1.ConditionFalse ||
		!strings.Contains(c.Message, "team/app:v1: "+refusal) || strings.Contains(c.Message, "ghost") {
		t.Errorf("Warmed %s: %q, want False naming team/app:v1 and the upstream's answer, and nothing of the pod not ready", c.Status, c.Message)
	}
	if !meta.IsStatusConditionTrue(rm.Status.Conditions, registryv1alpha1.ConditionReady) && meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionReady).Reason != ReasonStarting {
		t.Errorf("a failed warm changed Ready: %+v", meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionReady))
	}
	testenv.WaitForEvent(t, f.c, rm, registryv1alpha1.ReasonWarmFailed)

	// Fetched at the next try: Warmed, the size the fullest pod's volume holds.
	note(pods[1], mirror.NewCacheReport(hash, pinned, 21<<20, false, 0, nil))
	rm = warmed(registryv1alpha1.ReasonWarmed, fmt.Sprintf("the cache pods hold every one of the %d pinned image(s)", pinned), "37Mi")
	if c := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionWarmed); c.Status != metav1.ConditionTrue || c.ObservedGeneration != rm.Generation {
		t.Errorf("Warmed %+v, want True for generation %d", c, rm.Generation)
	}

	// Pinned content alone fills a pod's volume past its high-water mark: said, with what to do.
	note(pods[1], mirror.NewCacheReport(hash, pinned, 900<<20, true, 0, nil))
	rm = warmed(registryv1alpha1.ReasonWarmed, "pinned content alone is above the high-water mark on cache pod(s) "+pods[1].Name, "900Mi")
	testenv.WaitForEvent(t, f.c, rm, "PinnedOverHighWater")
}
