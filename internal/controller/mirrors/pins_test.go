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
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
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
		return slices.Equal(p.Refs(), inUse), strings.Join(p.Refs(), " ")
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
}
