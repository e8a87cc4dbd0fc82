package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/mirrors"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const (
	benchMirrors       = 50
	mirrorsNamespace   = "mirrors-bench"
	floorNamespace     = "mirrors-floor"
	objectsPerMirror   = 7 // Secret, pins ConfigMap, 2 Services, StatefulSet, PodDisruptionBudget, DaemonSet
	mirrorsIdle        = 30 * time.Second
	mirrorsBenchUpHost = "upstream.invalid"
)

// mirrorsBench runs the mirrors controller in-process: 50 RegistryMirrors that exist when it
// starts, until every mirror's seven objects exist and its status names its endpoint, with the API
// writes it took, then an idle period that must write nothing. The floor is a bare client making
// the same seven creates per mirror (the sed-script approach the controller replaces).
func mirrorsBench(ctx context.Context, e *env) ([]result, error) {
	scheme := manager.Scheme(registryv1alpha1.AddToScheme)
	c, err := client.New(e.cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if err := installCRDs(ctx, e, "registry.quartermaster.dev_registrymirrors.yaml"); err != nil {
		return nil, err
	}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mirrorsNamespace}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: floorNamespace}},
	}
	for i := range benchMirrors {
		objs = append(objs, &registryv1alpha1.RegistryMirror{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i)},
			// Hosts that resolve nowhere: the bench measures the controller, not an upstream.
			Spec: registryv1alpha1.RegistryMirrorSpec{UpstreamURL: fmt.Sprintf("https://r%d.%s", i, mirrorsBenchUpHost)},
		})
	}
	if err := createAll(ctx, c, objs); err != nil {
		return nil, err
	}

	cfg, counter := testenv.Counting(e.cluster.Config)
	mgr, err := newManager(cfg, ctrl.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	o := mirrors.Options{Namespace: mirrorsNamespace, Image: "quartermaster:bench", AgentServiceAccount: "default",
		Concurrency: 4, Resync: 10 * time.Minute, CheckUpstream: false, PinByUse: true}
	if err := mirrors.Setup(mgr, o); err != nil {
		return nil, err
	}
	began := time.Now()
	stop, err := startManager(ctx, mgr, "mirrors")
	if err != nil {
		return nil, err
	}
	if err := waitAllMirrored(ctx, c); err != nil {
		stop()
		return nil, err
	}
	took := time.Since(began)
	writes := counter.Writes()

	// The StatefulSet and DaemonSet controllers settle (pods created, status written) and the
	// mirrors' status shows it before the idle window starts: following their status changes is
	// the controller's job, not idling.
	if err := waitMirrorsSettled(ctx, c); err != nil {
		stop()
		return nil, err
	}
	counter.Reset()
	// Every mirror is reconciled in the window: a touch of its DaemonSet (by the bench's own
	// client, not counted) wakes it, and a reconcile of a mirror that is right writes nothing.
	if err := touchDaemonSets(ctx, c); err != nil {
		stop()
		return nil, err
	}
	time.Sleep(mirrorsIdle)
	idleWrites := counter.Writes()
	idleNote := "must be 0"
	if idleWrites > 0 {
		idleNote = fmt.Sprintf("must be 0; first: %v", firstWrites(counter.Log(), 5))
	}
	stop()

	floor, err := mirrorsFloor(ctx, c)
	if err != nil {
		return nil, err
	}
	return []result{
		{metric: fmt.Sprintf("bare client, the same %d creates per mirror, 16 writers", objectsPerMirror),
			value: benchMirrors / floor.Seconds(), unit: "mirrors/s", note: fmt.Sprintf("%.2f s for %d mirrors' objects", floor.Seconds(), benchMirrors)},
		{metric: fmt.Sprintf("%d RegistryMirrors existing at start: seconds until every mirror's objects exist and its status has the endpoint", benchMirrors),
			value: took.Seconds(), unit: "s",
			note: fmt.Sprintf("%.0f mirrors/s = %.2fx the bare client", benchMirrors/took.Seconds(), floor.Seconds()/took.Seconds())},
		{metric: "API writes per mirror", value: float64(writes) / benchMirrors, unit: "requests",
			note: fmt.Sprintf("minimum %d creates + 1 status write", objectsPerMirror)},
		{metric: fmt.Sprintf("API writes during %s at steady state, every mirror reconciled once in it (DaemonSets touched)", mirrorsIdle),
			value: float64(idleWrites), unit: "requests", note: idleNote},
	}, nil
}

// waitAllMirrored waits until every bench mirror has its DaemonSet (the last object made) and an
// endpoint in its status.
func waitAllMirrored(ctx context.Context, c client.Client) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list := &registryv1alpha1.RegistryMirrorList{}
		if err := c.List(ctx, list); err != nil {
			return false, err
		}
		n := 0
		for _, rm := range list.Items {
			if rm.Status.Endpoint != "" && rm.Status.ObservedGeneration == rm.Generation {
				n++
			}
		}
		if n < benchMirrors {
			return false, nil
		}
		ds := &appsv1.DaemonSetList{}
		if err := c.List(ctx, ds, client.InNamespace(mirrorsNamespace)); err != nil {
			return false, err
		}
		return len(ds.Items) >= benchMirrors, nil
	})
}

// touchDaemonSets annotates every bench DaemonSet, which wakes its mirror's reconcile.
func touchDaemonSets(ctx context.Context, c client.Client) error {
	list := &appsv1.DaemonSetList{}
	if err := c.List(ctx, list, client.InNamespace(mirrorsNamespace)); err != nil {
		return err
	}
	return parallel(16, len(list.Items), func(i int) error {
		ds := &list.Items[i]
		patch := client.MergeFrom(ds.DeepCopy())
		if ds.Annotations == nil {
			ds.Annotations = map[string]string{}
		}
		ds.Annotations["bench.quartermaster.dev/touched"] = time.Now().Format(time.RFC3339Nano)
		return c.Patch(ctx, ds, patch)
	})
}

// waitMirrorsSettled waits until every bench mirror's status shows all its nodes configured, as
// of its DaemonSet's current status. (The cache pods stay Pending: kwok binds no volumes.)
func waitMirrorsSettled(ctx context.Context, c client.Client) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		ds := &appsv1.DaemonSetList{}
		if err := c.List(ctx, ds, client.InNamespace(mirrorsNamespace)); err != nil {
			return false, err
		}
		ready := map[string]int32{}
		for _, d := range ds.Items {
			st := d.Status
			if st.ObservedGeneration != d.Generation || st.DesiredNumberScheduled == 0 || st.NumberReady != st.DesiredNumberScheduled {
				return false, nil
			}
			ready[d.Labels[mirror.LabelMirror]] = st.NumberReady
		}
		list := &registryv1alpha1.RegistryMirrorList{}
		if err := c.List(ctx, list); err != nil {
			return false, err
		}
		for _, rm := range list.Items {
			if rm.Status.NodesConfigured != ready[rm.Name] {
				return false, nil
			}
		}
		return len(ready) >= benchMirrors, nil
	})
}

// mirrorsFloor creates, with a bare client and 16 writers, exactly the objects the controller
// makes for the bench's mirrors, and returns how long that took.
func mirrorsFloor(ctx context.Context, c client.Client) (time.Duration, error) {
	in := mirror.Install{Namespace: floorNamespace, Image: "quartermaster:bench", AgentServiceAccount: "default"}
	start := time.Now()
	err := parallel(16, benchMirrors, func(i int) error {
		rm := &registryv1alpha1.RegistryMirror{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("floor-%d", i)},
			Spec: registryv1alpha1.RegistryMirrorSpec{UpstreamURL: fmt.Sprintf("https://r%d.%s", i, mirrorsBenchUpHost)}}
		s, err := mirror.Resolve(rm)
		if err != nil {
			return err
		}
		config, err := mirror.CacheConfig(mirror.CacheParams{UpstreamURL: s.UpstreamURL, TTL: s.TTL})
		if err != nil {
			return err
		}
		secret := mirror.CacheSecret(in, s, config, nil)
		svc := mirror.Service(in, s)
		pins, err := mirror.PinsConfigMap(in, s, mirror.Pins{})
		if err != nil {
			return err
		}
		for _, obj := range []client.Object{secret, pins, mirror.HeadlessService(in, s), svc,
			mirror.StatefulSet(in, s, mirror.ConfigHash(secret.Data)), mirror.PodDisruptionBudget(in, s)} {
			if err := c.Create(ctx, obj); err != nil {
				return err
			}
		}
		return c.Create(ctx, mirror.AgentDaemonSet(in, s, mirror.Endpoint(svc)))
	})
	return time.Since(start), err
}

// firstWrites lists up to n of the logged requests that are writes.
func firstWrites(log []string, n int) []string {
	var out []string
	for _, l := range log {
		if !strings.HasPrefix(l, "GET ") && len(out) < n {
			out = append(out, l)
		}
	}
	return out
}
