package mirrors

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
)

// usagePod is a Pod as a cluster holds it: labels, annotations, two containers with env,
// resources, mounts and probes, volumes, and a status with conditions and container statuses.
func usagePod(i int) *corev1.Pod {
	app := fmt.Sprintf("app-%03d", i%200)
	containers := []corev1.Container{{
		Name: "main", Image: fmt.Sprintf("docker.io/team/%s:v%d", app, i%3),
		Env:          []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
		Resources:    corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}},
		VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
		Ports:        []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
	}, {Name: "proxy", Image: "docker.io/envoyproxy/envoy:v1.31.0"}}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("%s-%08d-x7k2p", app, i), Namespace: fmt.Sprintf("team-%02d", i%50), ResourceVersion: fmt.Sprint(100000 + i),
			UID:             types.UID(fmt.Sprintf("9b2d5e1c-0000-4000-8000-%012d", i)),
			Labels:          map[string]string{"app": app, "pod-template-hash": "5d8f7c9b4", "team": "payments"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-01T10:00:00Z", "prometheus.io/scrape": "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-5d8f7c9b4", UID: "rs-uid", Controller: new(true)}},
		},
		Spec: corev1.PodSpec{
			Containers: containers, NodeName: fmt.Sprintf("node-%03d", i%100), ServiceAccountName: "default",
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.244.1.17", HostIP: "192.168.0.7",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "main", Ready: true, Image: containers[0].Image, ImageID: "docker.io/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", ContainerID: "containerd://abc"},
				{Name: "proxy", Ready: true, Image: containers[1].Image, ImageID: "docker.io/envoyproxy/envoy@sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210", ContainerID: "containerd://def"},
			},
		},
	}
}

// The usage cache's cost: 10,000 Pods as its informer keeps them (the transformed objects in a
// store with the namespace and image-host indexes) within the 30 MB budget. Not parallel:
// it measures the process's heap.
func TestUsageCacheCost(t *testing.T) {
	const pods = 10000
	store := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{
		toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc,
		indexImageHost:            byImageHost,
	})
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for i := range pods {
		obj, err := keepImages(usagePod(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	after := heap()
	runtime.KeepAlive(store)
	per := float64(after-before) / pods
	t.Logf("usage cache: %.0f bytes per Pod, %.1f MB for %d Pods", per, float64(after-before)/1e6, pods)
	if after-before > 30e6 {
		t.Errorf("the usage cache holds %.1f MB for %d Pods: the budget is 30 MB", float64(after-before)/1e6, pods)
	}
	got, err := store.ByIndex(indexImageHost, "docker.io")
	if err != nil || len(got) != pods {
		t.Errorf("image-host index: %d Pods (%v), want %d", len(got), err, pods)
	}
	if u := got[0].(*imageUse); len(u.Images) != 2 || u.Labels != nil || u.Annotations != nil || u.OwnerReferences != nil || u.Ended {
		t.Errorf("the transform kept more than the images: %+v", u)
	}
}
