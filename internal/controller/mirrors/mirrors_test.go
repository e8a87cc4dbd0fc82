package mirrors

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

func TestMirrors(t *testing.T) {
	t.Parallel()
	f := start(t)
	t.Run("validation", func(t *testing.T) { testValidation(t, f) })
	t.Run("objects", func(t *testing.T) { testObjects(t, f) })
	t.Run("updates", func(t *testing.T) { testUpdates(t, f) })
	t.Run("credentials", func(t *testing.T) { testCredentials(t, f) })
	t.Run("duplicate host", func(t *testing.T) { testDuplicateHost(t, f) })
	t.Run("name taken", func(t *testing.T) { testNameTaken(t, f) })
	t.Run("node port", func(t *testing.T) { testNodePort(t, f) })
	t.Run("stale cache", func(t *testing.T) { testStaleCache(t, f) })
	t.Run("cache pod failing", func(t *testing.T) { testCachePodFailing(t, f) })
	t.Run("pinned by use", func(t *testing.T) { testPinnedByUse(t, f) })
}

// testCachePodFailing plays the kubelet (envtest runs none): a cache pod whose storage init
// container refused its volume stalls the mirror with the pod, the claim and the init container's
// own message, with a Warning Event; once the pod runs, the mirror is Ready.
func testCachePodFailing(t *testing.T, f *fixture) {
	ctx := context.Background()
	const name = "failing"
	f.create(t, mirrorOf(name, f.open, ""))
	sts := &appsv1.StatefulSet{}
	f.waitObject(t, mirror.CacheName(name), sts, nil)
	if init := sts.Spec.Template.Spec.InitContainers; len(init) != 1 || init[0].Name != mirror.StorageInit ||
		!slices.Equal(init[0].SecurityContext.Capabilities.Add, []corev1.Capability{"CHOWN"}) {
		t.Fatalf("the cache pods' init containers: %+v, want the storage init container with CHOWN alone", init)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: mirror.CacheName(name) + "-0", Labels: sts.Spec.Template.Labels},
		Spec:       sts.Spec.Template.Spec,
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: mirror.PVCName(name, 0)},
	}})
	f.create(t, pod)
	const refusal = "the cache's volume at /var/lib/registry is not writable by uid 65532 (gid 65532): it is owned by 0:0, mode 0750; it already holds data"
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{
		Name: mirror.StorageInit, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: refusal}},
	}}
	must(t, f.c.Status().Update(ctx, pod))
	rm := f.waitReason(t, name, ReasonCacheFailing)
	c := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionReady)
	want := "pod " + pod.Name + " (volume cache, PersistentVolumeClaim " + mirror.PVCName(name, 0) + "): init container storage exited 1: " + refusal
	if c.Message != want {
		t.Errorf("Ready message:\n got %q\nwant %q", c.Message, want)
	}
	if !meta.IsStatusConditionTrue(rm.Status.Conditions, "Stalled") {
		t.Errorf("want Stalled: a person must fix the volume")
	}
	testenv.WaitForEvent(t, f.c, rm, ReasonCacheFailing)

	// The volume fixed, the pod runs: the mirror is Ready.
	pod.Status.InitContainerStatuses[0] = corev1.ContainerStatus{Name: mirror.StorageInit, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}}
	must(t, f.c.Status().Update(ctx, pod))
	f.becomeReady(t, name, 1)
	f.waitReason(t, name, ReasonReady)
}

func testValidation(t *testing.T, f *fixture) {
	ctx := context.Background()
	cases := []struct {
		name   string
		mutate func(*registryv1alpha1.RegistryMirror)
		want   string
	}{
		{"a path after the root", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.UpstreamURL = "https://quay.io/v2/foo" }, "upstreamUrl must be a registry root"},
		{"another scheme", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.UpstreamURL = "ftp://quay.io" }, "upstreamUrl must be a registry root"},
		{"credentials in the URL", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.UpstreamURL = "https://me:pw@quay.io" }, "upstreamUrl must be a registry root"},
		{"a query", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.UpstreamURL = "https://quay.io?x=1" }, "upstreamUrl must be a registry root"},
		{"a name with dots", func(rm *registryv1alpha1.RegistryMirror) { rm.Name = "docker.io" }, "metadata.name must be a DNS label"},
		{"a long name", func(rm *registryv1alpha1.RegistryMirror) { rm.Name = strings.Repeat("a", 41) }, "metadata.name must be a DNS label of at most 40"},
		{"zero replicas", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.Replicas = ptr.To[int32](0) }, "spec.replicas"},
		{"a negative ttl", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.TTL = &metav1.Duration{Duration: -1} }, "ttl must be a duration of zero or more"},
		{"a zero size", func(rm *registryv1alpha1.RegistryMirror) {
			rm.Spec.Storage = &registryv1alpha1.Storage{Size: ptr.To(resource.MustParse("0"))}
		}, "storage.size must be more than zero"},
		{"a mirror host with a path", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.MirrorHost = "docker.io/library" }, "mirrorHost must be a host name"},
		{"masqueradeUrl and mirrorHost disagree", func(rm *registryv1alpha1.RegistryMirror) {
			rm.Spec.MirrorHost, rm.Spec.MasqueradeURL = "a.example", "b.example"
		}, "masqueradeUrl is the older name of mirrorHost"},
		{"a credentials Secret that is no name", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.CredentialsSecret = "Pull_Creds" }, "credentialsSecret must be a Secret name"},
		{"an unknown deletion policy", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.DeletionPolicy = "Orphan" }, "spec.deletionPolicy"},
		{"a LoadBalancer", func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.ServiceType = corev1.ServiceTypeLoadBalancer }, "spec.serviceType"},
		{"a name another mirror's agent has", func(rm *registryv1alpha1.RegistryMirror) { rm.Name = "hub-agent" }, "must not end in -headless, -agent or -cache"},
		{"a name another mirror's headless Service has", func(rm *registryv1alpha1.RegistryMirror) { rm.Name = "hub-headless" }, "must not end in -headless"},
		{"a high-water mark of 100%", func(rm *registryv1alpha1.RegistryMirror) {
			rm.Spec.Eviction = &registryv1alpha1.Eviction{HighWaterPercent: 100}
		}, "spec.eviction.highWaterPercent"},
		{"a low-water mark above the high one", func(rm *registryv1alpha1.RegistryMirror) {
			rm.Spec.Eviction = &registryv1alpha1.Eviction{HighWaterPercent: 60, LowWaterPercent: ptr.To[int32](70)}
		}, "eviction.lowWaterPercent must be below eviction.highWaterPercent"},
		{"a prefetch entry with an upper-case repository", func(rm *registryv1alpha1.RegistryMirror) {
			rm.Spec.Prefetch = []string{"quay.io/Team/app:v1"}
		}, "prefetch: each entry must be an image reference"},
		{"a prefetch entry with a space", func(rm *registryv1alpha1.RegistryMirror) {
			rm.Spec.Prefetch = []string{"quay.io/team/app v1"}
		}, "prefetch: each entry must be an image reference"},
		{"a prefetch entry with a short digest", func(rm *registryv1alpha1.RegistryMirror) {
			rm.Spec.Prefetch = []string{"quay.io/team/app@sha256:12ab"}
		}, "prefetch: each entry must be an image reference"},
		{"a low-water mark above the default high one", func(rm *registryv1alpha1.RegistryMirror) {
			rm.Spec.Eviction = &registryv1alpha1.Eviction{LowWaterPercent: ptr.To[int32](90)}
		}, "eviction.lowWaterPercent must be below eviction.highWaterPercent"},
	}
	for _, tc := range cases {
		rm := mirrorOf("invalid", "https://quay.io", "")
		tc.mutate(rm)
		err := f.c.Create(ctx, rm)
		if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an Invalid error with %q", tc.name, err, tc.want)
			_ = f.c.Delete(ctx, rm)
		}
	}

	t.Run("an older object moves over unchanged but for its apiVersion; defaults are filled in", func(t *testing.T) {
		rm := &registryv1alpha1.RegistryMirror{
			ObjectMeta: metav1.ObjectMeta{Name: "legacy"},
			Spec:       registryv1alpha1.RegistryMirrorSpec{UpstreamURL: "hub.docker.io", MasqueradeURL: "legacy.docker.example", CredentialsSecret: "internal-mirror"},
		}
		f.create(t, rm)
		defer func() { must(t, f.c.Delete(ctx, rm)) }()
		if *rm.Spec.Replicas != 2 || rm.Spec.TTL.Duration.String() != "168h0m0s" || rm.Spec.DeletionPolicy != registryv1alpha1.DeletionPolicyRetain ||
			rm.Spec.ServiceType != corev1.ServiceTypeClusterIP || rm.Spec.Eviction != nil {
			t.Errorf("defaults: %+v", rm.Spec)
		}
		s, err := mirror.Resolve(rm)
		must(t, err)
		if s.UpstreamURL != "https://hub.docker.io" || s.MirrorHost != "legacy.docker.example" || s.HighWater != 85 || s.LowWater != 75 {
			t.Errorf("resolved upstream %s host %s marks %d/%d", s.UpstreamURL, s.MirrorHost, s.HighWater, s.LowWater)
		}
	})

	t.Run("the samples are valid", func(t *testing.T) {
		files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "samples", "registry", "*.yaml"))
		must(t, err)
		if len(files) == 0 {
			t.Fatal("no samples")
		}
		for _, file := range files {
			b, err := os.ReadFile(file)
			must(t, err)
			rm := &registryv1alpha1.RegistryMirror{}
			must(t, yaml.UnmarshalStrict(b, rm))
			rm.Name = "sample-" + rm.Name
			if err := f.c.Create(ctx, rm, client.DryRunAll); err != nil {
				t.Errorf("%s: %v", filepath.Base(file), err)
			}
		}
	})

	t.Run("upstream and host are immutable", func(t *testing.T) {
		rm := mirrorOf("immutable-upstream", "https://quay.io", "")
		f.create(t, rm)
		defer func() { must(t, f.c.Delete(ctx, rm)) }()
		for what, mutate := range map[string]func(*registryv1alpha1.RegistryMirror){
			"upstreamUrl is immutable":      func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.UpstreamURL = "https://ghcr.io" },
			"mirrorHost (masqueradeUrl) is": func(rm *registryv1alpha1.RegistryMirror) { rm.Spec.MirrorHost = "quay.example" },
		} {
			changed := rm.DeepCopy()
			mutate(changed)
			if err := f.c.Patch(ctx, changed, client.MergeFrom(rm)); err == nil || !strings.Contains(err.Error(), what) {
				t.Errorf("got %v, want %q", err, what)
			}
		}
	})

	t.Run("storage is immutable", func(t *testing.T) {
		rm := mirrorOf("immutable-storage", "https://quay.io", "immutable.example")
		rm.Spec.Storage = &registryv1alpha1.Storage{Size: ptr.To(resource.MustParse("10Gi"))}
		f.create(t, rm)
		defer func() { must(t, f.c.Delete(ctx, rm)) }()
		base := rm.DeepCopy()
		rm.Spec.Storage.Size = ptr.To(resource.MustParse("50Gi"))
		err := f.c.Patch(ctx, rm, client.MergeFrom(base))
		if err == nil || !strings.Contains(err.Error(), "storage is immutable") {
			t.Errorf("resize: got %v, want the immutability error", err)
		}
	})
}

func testObjects(t *testing.T, f *fixture) {
	rm := mirrorOf("hub", f.open, "docker.io")
	f.create(t, rm)
	got := f.waitReason(t, "hub", ReasonStarting)

	t.Run("every object exists in the operator's namespace, owned by the mirror", func(t *testing.T) {
		for name, obj := range map[string]client.Object{
			mirror.SecretName("hub"):   &corev1.Secret{},
			mirror.HeadlessName("hub"): &corev1.Service{},
			mirror.CacheName("hub"):    &corev1.Service{},
			mirror.AgentName("hub"):    &appsv1.DaemonSet{},
			"mirror-hub":               &appsv1.StatefulSet{},
		} {
			f.object(t, name, obj)
			ref := metav1.GetControllerOf(obj)
			if ref == nil || ref.UID != got.UID || ref.Kind != "RegistryMirror" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
				t.Errorf("%T %s: controller reference %+v", obj, name, ref)
			}
			if obj.GetLabels()[mirror.LabelMirror] != "hub" {
				t.Errorf("%T %s: labels %v", obj, name, obj.GetLabels())
			}
		}
		pdb := &policyv1.PodDisruptionBudget{}
		f.object(t, mirror.CacheName("hub"), pdb)
		if metav1.GetControllerOf(pdb) == nil {
			t.Errorf("PodDisruptionBudget not owned")
		}
	})

	t.Run("the cache runs the rendered configuration; the agents get the Service's address", func(t *testing.T) {
		secret := &corev1.Secret{}
		f.object(t, mirror.SecretName("hub"), secret)
		cfg, err := mirror.ParseCacheConfig(secret.Data[mirror.ConfigFile])
		must(t, err)
		if cfg.Upstream != f.open {
			t.Errorf("proxy.remoteurl %q", cfg.Upstream)
		}
		if _, ok := secret.Data[mirror.UsernameKey]; ok {
			t.Errorf("an anonymous mirror's Secret has a username")
		}
		svc := &corev1.Service{}
		f.object(t, mirror.CacheName("hub"), svc)
		want := "http://" + svc.Spec.ClusterIP + ":5000"
		if got.Status.Endpoint != want || got.Status.MirrorHost != "docker.io" {
			t.Errorf("status endpoint %q host %q, want %q docker.io", got.Status.Endpoint, got.Status.MirrorHost, want)
		}
		ds := &appsv1.DaemonSet{}
		f.object(t, mirror.AgentName("hub"), ds)
		args := strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " ")
		for _, a := range []string{"node-agent", "--mirror=hub", "--mirror-host=docker.io", "--endpoint=" + want, "--upstream=" + f.open} {
			if !strings.Contains(args, a) {
				t.Errorf("agent args %q lack %q", args, a)
			}
		}
		sts := &appsv1.StatefulSet{}
		f.object(t, mirror.CacheName("hub"), sts)
		if sts.Spec.Template.Annotations[mirror.AnnotationConfigHash] != mirror.ConfigHash(secret.Data) {
			t.Errorf("config hash %q", sts.Spec.Template.Annotations)
		}
		if p := sts.Spec.PersistentVolumeClaimRetentionPolicy; p == nil || p.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
			t.Errorf("retention %+v, want Retain", p)
		}
		if *sts.Spec.Replicas != 2 || sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String() != "20Gi" {
			t.Errorf("replicas %d, volume %v", *sts.Spec.Replicas, sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests)
		}
	})

	t.Run("an Event says what was created", func(t *testing.T) {
		ev := testenv.WaitForEvent(t, f.c, got, "Applied")
		for _, want := range []string{"created Secret mirror-hub-cache", "created StatefulSet mirror-hub", "created DaemonSet mirror-hub-agent"} {
			if !strings.Contains(ev.Note, want) {
				t.Errorf("Event %q lacks %q", ev.Note, want)
			}
		}
	})

	t.Run("Ready once the cache pods and the agents are", func(t *testing.T) {
		f.becomeReady(t, "hub", 3)
		rm := f.waitReason(t, "hub", ReasonReady)
		if rm.Status.ReadyReplicas != 2 || rm.Status.NodesConfigured != 3 || rm.Status.NodesDesired != 3 {
			t.Errorf("status %+v", rm.Status)
		}
	})

	t.Run("a reconcile of a ready mirror writes nothing", func(t *testing.T) {
		if w := f.reconcileWrites(t, "hub"); len(w) != 0 {
			t.Errorf("%d writes: %v", len(w), w)
		}
	})
}

func testUpdates(t *testing.T, f *fixture) {
	rm := mirrorOf("quay", f.open, "quay.io")
	rm.Spec.DeletionPolicy = registryv1alpha1.DeletionPolicyDelete
	f.create(t, rm)
	f.waitReason(t, "quay", ReasonStarting)
	sts := &appsv1.StatefulSet{}
	f.object(t, mirror.CacheName("quay"), sts)
	if sts.Spec.PersistentVolumeClaimRetentionPolicy.WhenDeleted != appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
		t.Errorf("deletionPolicy Delete: retention %+v", sts.Spec.PersistentVolumeClaimRetentionPolicy)
	}
	hash := sts.Spec.Template.Annotations[mirror.AnnotationConfigHash]

	f.patch(t, rm, func() {
		rm.Spec.Replicas = ptr.To[int32](3)
		rm.Spec.TTL = &metav1.Duration{Duration: 0}
	})
	f.waitObject(t, mirror.CacheName("quay"), sts, func() (bool, string) {
		h := sts.Spec.Template.Annotations[mirror.AnnotationConfigHash]
		return *sts.Spec.Replicas == 3 && h != hash, "replicas and config hash not changed yet"
	})

	t.Run("a field removed from the spec is removed from the objects", func(t *testing.T) {
		f.patch(t, rm, func() {
			rm.Spec.NodeSelector = map[string]string{"pool": "a", "zone": "z1"}
			rm.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
		})
		ds := &appsv1.DaemonSet{}
		f.waitObject(t, mirror.AgentName("quay"), ds, func() (bool, string) {
			p := ds.Spec.Template.Spec
			return len(p.NodeSelector) == 2 && len(p.Tolerations) == 1, fmt.Sprint(p.NodeSelector, p.Tolerations)
		})
		f.patch(t, rm, func() {
			rm.Spec.NodeSelector = map[string]string{"pool": "a"}
			rm.Spec.Tolerations = nil
		})
		f.waitObject(t, mirror.AgentName("quay"), ds, func() (bool, string) {
			p := ds.Spec.Template.Spec
			return len(p.NodeSelector) == 1 && len(p.Tolerations) == 0, fmt.Sprint(p.NodeSelector, p.Tolerations)
		})
		f.waitReason(t, "quay", ReasonStarting)
		if w := f.reconcileWrites(t, "quay"); len(w) != 0 {
			t.Errorf("%d writes by a reconcile of a mirror with a node selector: %v", len(w), w)
		}
	})

	t.Run("a container added by hand is removed; others' annotations stay", func(t *testing.T) {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: mirror.AgentName("quay")}}
		f.patch(t, ds, func() {
			ds.Spec.Template.Spec.Containers = append(ds.Spec.Template.Spec.Containers, corev1.Container{Name: "sidecar", Image: "busybox"})
			ds.Spec.Template.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-23T12:00:00Z"}
		})
		f.waitObject(t, mirror.AgentName("quay"), ds, func() (bool, string) {
			return len(ds.Spec.Template.Spec.Containers) == 1, fmt.Sprintf("%d containers", len(ds.Spec.Template.Spec.Containers))
		})
		if ds.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] == "" {
			t.Errorf("the update dropped kubectl's restart annotation: %v", ds.Spec.Template.Annotations)
		}
	})

	t.Run("a changed object is put back", func(t *testing.T) {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: mirror.AgentName("quay")}}
		f.patch(t, ds, func() { ds.Spec.Template.Spec.Containers[0].Args = []string{"node-agent", "--mirror=someone-else"} })
		f.waitObject(t, mirror.AgentName("quay"), ds, func() (bool, string) {
			args := strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " ")
			return strings.Contains(args, "--mirror=quay "), args
		})
	})
}

func testCredentials(t *testing.T, f *fixture) {
	ctx := context.Background()
	creds := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "internal-pull"},
		Data:       map[string][]byte{"username": []byte("puller"), "password": []byte("right")},
	}
	f.create(t, creds)
	rm := mirrorOf("internal", f.guarded, "registry.internal")
	rm.Spec.CredentialsSecret = "internal-pull"
	f.create(t, rm)
	f.waitReason(t, "internal", ReasonStarting)
	secret := &corev1.Secret{}
	f.object(t, mirror.SecretName("internal"), secret)
	if string(secret.Data[mirror.UsernameKey]) != "puller" || string(secret.Data[mirror.PasswordKey]) != "right" {
		t.Errorf("cache Secret keys %v", keys(secret.Data))
	}
	sts := &appsv1.StatefulSet{}
	f.object(t, mirror.CacheName("internal"), sts)
	hash := sts.Spec.Template.Annotations[mirror.AnnotationConfigHash]

	t.Run("credentials the upstream refuses stall the mirror, naming it; the cache keeps the ones it accepts", func(t *testing.T) {
		creds.Data["password"] = []byte("wrong")
		must(t, f.c.Update(ctx, creds))
		rm := f.waitReason(t, "internal", ReasonUnauthorized)
		c := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionStalled)
		if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, f.guarded) || !strings.Contains(c.Message, "401") ||
			!strings.Contains(c.Message, "keeps its previous credentials") {
			t.Errorf("Stalled %+v", c)
		}
		if strings.Contains(c.Message, "wrong") {
			t.Errorf("the message shows the password: %s", c.Message)
		}
		f.object(t, mirror.SecretName("internal"), secret)
		f.object(t, mirror.CacheName("internal"), sts)
		if string(secret.Data[mirror.PasswordKey]) != "right" || sts.Spec.Template.Annotations[mirror.AnnotationConfigHash] != hash {
			t.Errorf("the refused password replaced the good one")
		}
	})

	t.Run("rotated credentials roll the cache", func(t *testing.T) {
		creds.Data["password"] = []byte("rotated")
		must(t, f.c.Update(ctx, creds))
		f.waitReason(t, "internal", ReasonStarting)
		f.object(t, mirror.SecretName("internal"), secret)
		f.object(t, mirror.CacheName("internal"), sts)
		if string(secret.Data[mirror.PasswordKey]) != "rotated" {
			t.Errorf("the cache Secret has not the rotated password")
		}
		if h := sts.Spec.Template.Annotations[mirror.AnnotationConfigHash]; h == hash || h != mirror.ConfigHash(secret.Data) {
			t.Errorf("config hash %s (was %s) does not follow the Secret", h, hash)
		}
	})

	t.Run("a malformed Secret stalls the mirror and the cache keeps its last good credentials", func(t *testing.T) {
		delete(creds.Data, "password")
		must(t, f.c.Update(ctx, creds))
		rm := f.waitReason(t, "internal", ReasonCredentials)
		c := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionStalled)
		if c == nil || !strings.Contains(c.Message, testNamespace+"/internal-pull") || !strings.Contains(c.Message, `"password"`) {
			t.Errorf("Stalled %+v", c)
		}
		f.object(t, mirror.SecretName("internal"), secret)
		if string(secret.Data[mirror.PasswordKey]) != "rotated" {
			t.Errorf("the cache lost its credentials")
		}
	})

	t.Run("another mirror's cache Secret is refused as credentials", func(t *testing.T) {
		rm := mirrorOf("borrower", f.open, "borrower.example")
		rm.Spec.CredentialsSecret = mirror.SecretName("internal")
		f.create(t, rm)
		got := f.waitReason(t, "borrower", ReasonCredentials)
		if c := meta.FindStatusCondition(got.Status.Conditions, registryv1alpha1.ConditionReady); !strings.Contains(c.Message, "a mirror's own Secret") {
			t.Errorf("message %q", c.Message)
		}
	})

	t.Run("a mirror whose Secret is missing waits for it and creates nothing", func(t *testing.T) {
		rm := mirrorOf("nocreds", f.guarded, "nocreds.internal")
		rm.Spec.CredentialsSecret = "not-there"
		f.create(t, rm)
		got := f.waitReason(t, "nocreds", ReasonCredentials)
		if c := meta.FindStatusCondition(got.Status.Conditions, registryv1alpha1.ConditionReady); !strings.Contains(c.Message, testNamespace+"/not-there") {
			t.Errorf("message %q does not name the Secret", c.Message)
		}
		err := f.c.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: mirror.CacheName("nocreds")}, &appsv1.StatefulSet{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("StatefulSet: %v, want none", err)
		}
		f.create(t, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "not-there"},
			Data:       map[string][]byte{"username": []byte("puller"), "password": []byte("right")},
		})
		f.waitReason(t, "nocreds", ReasonStarting)
	})
}

func testDuplicateHost(t *testing.T, f *fixture) {
	ctx := context.Background()
	first := mirrorOf("ghcr", f.open, "ghcr.io")
	f.create(t, first)
	f.waitReason(t, "ghcr", ReasonStarting)
	second := mirrorOf("ghcr-again", f.open, "ghcr.io")
	f.create(t, second)
	got := f.waitReason(t, "ghcr-again", ReasonDuplicateHost)
	if c := meta.FindStatusCondition(got.Status.Conditions, registryv1alpha1.ConditionReady); !strings.Contains(c.Message, `"ghcr"`) {
		t.Errorf("message %q does not name the mirror serving the host", c.Message)
	}
	err := f.c.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: mirror.AgentName("ghcr-again")}, &appsv1.DaemonSet{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the refused mirror's agents: %v, want none", err)
	}
	// envtest has no garbage collector: the first mirror's objects stay, the second takes over
	// the host all the same.
	must(t, f.c.Delete(ctx, first))
	f.waitReason(t, "ghcr-again", ReasonStarting)
}

func testNameTaken(t *testing.T, f *fixture) {
	f.create(t, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: mirror.CacheName("taken")},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	})
	f.create(t, mirrorOf("taken", f.open, "taken.example"))
	got := f.waitReason(t, "taken", ReasonNameTaken)
	if c := meta.FindStatusCondition(got.Status.Conditions, registryv1alpha1.ConditionReady); !strings.Contains(c.Message, "Service "+testNamespace+"/mirror-taken") {
		t.Errorf("message %q", c.Message)
	}
}

func testNodePort(t *testing.T, f *fixture) {
	rm := mirrorOf("nodeport", f.open, "nodeport.example")
	rm.Spec.ServiceType = corev1.ServiceTypeNodePort
	f.create(t, rm)
	got := f.waitReason(t, "nodeport", ReasonStarting)
	svc := &corev1.Service{}
	f.object(t, mirror.CacheName("nodeport"), svc)
	if want := "http://127.0.0.1:" + itoa(svc.Spec.Ports[0].NodePort); got.Status.Endpoint != want {
		t.Errorf("endpoint %q, want %q", got.Status.Endpoint, want)
	}
	f.becomeReady(t, "nodeport", 1)
	f.waitReason(t, "nodeport", ReasonReady)
	if w := f.reconcileWrites(t, "nodeport"); len(w) != 0 {
		t.Errorf("%d writes: the allocated node port must not count as a difference: %v", len(w), w)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }
