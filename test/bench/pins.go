package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// Pinning by use at scale: the manager (its own process, the mirrors controller alone) with a
// Docker Hub mirror, then pinsPods Pods in pinsNamespaces namespaces naming pinsImages
// application images and one sidecar image: its RSS growth (the budget: 30 MB for 10,000
// Pods), and how long after the last Pod the mirror's pins name every image.
const (
	pinsPods       = 10000
	pinsNamespaces = 50
	pinsImages     = 200
)

func pinsBench(ctx context.Context, e *env) ([]result, error) {
	if err := installCRDs(ctx, e, "registry.quartermaster.dev_registrymirrors.yaml"); err != nil {
		return nil, err
	}
	c, err := client.New(e.cluster.Config, client.Options{Scheme: manager.Scheme(registryv1alpha1.AddToScheme)})
	if err != nil {
		return nil, err
	}
	const mirrorsNS = "bench-pins-mirrors"
	for i := -1; i < pinsNamespaces; i++ {
		name := mirrorsNS
		if i >= 0 {
			name = fmt.Sprintf("bench-pins-%02d", i)
		}
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			return nil, err
		}
	}
	p, err := startProcess(e, "--controllers=mirrors", "--mirrors-namespace="+mirrorsNS, "--mirrors-image=quartermaster:bench",
		"--mirrors-check-upstream=false", "--mirrors-agent-service-account=default")
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.stop() }()
	rm := &registryv1alpha1.RegistryMirror{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-hub"},
		Spec:       registryv1alpha1.RegistryMirrorSpec{UpstreamURL: "https://registry-1.docker.io"},
	}
	if err := c.Create(ctx, rm); err != nil {
		return nil, err
	}
	pinsOf := func() (int, error) {
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: mirrorsNS, Name: mirror.PinsName(rm.Name)}, cm); err != nil {
			return 0, err
		}
		pins, err := mirror.ParsePins([]byte(cm.Data[mirror.PinsFile]))
		return len(pins.Images), err
	}
	// The mirror's own image (its cache StatefulSet and agent DaemonSet run quartermaster:bench, a
	// Docker Hub name) is the one pin before the Pods.
	const own = 1
	if err := waitFor(ctx, 2*time.Minute, func() bool { n, err := pinsOf(); return err == nil && n == own }); err != nil {
		return nil, fmt.Errorf("the mirror's pins ConfigMap: %w\n%s", err, p.logs.Tail(4000))
	}
	time.Sleep(idleWindow) // the process settles before its RSS is read (the idle window of manager/every-controller)
	rssBefore, err := p.rssMiB()
	if err != nil {
		return nil, err
	}

	start := time.Now()
	if err := parallel(16, pinsPods, func(i int) error {
		app := fmt.Sprintf("app-%03d", i%pinsImages)
		return c.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("bench-pins-%02d", i%pinsNamespaces), Name: fmt.Sprintf("%s-%05d", app, i),
				Labels: map[string]string{"app": app, "team": "payments"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{
				{Name: "main", Image: "docker.io/team/" + app + ":v1",
					Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}}},
				{Name: "proxy", Image: "envoyproxy/envoy:v1.31.0"},
			}},
		})
	}); err != nil {
		return nil, err
	}
	created := time.Since(start)
	last := time.Now()
	if err := waitFor(ctx, 5*time.Minute, func() bool { n, err := pinsOf(); return err == nil && n == own+pinsImages+1 }); err != nil {
		n, _ := pinsOf()
		return nil, fmt.Errorf("the pins name %d images, want %d: %w\n%s", n, own+pinsImages+1, err, p.logs.Tail(4000))
	}
	settled := time.Since(last)
	time.Sleep(idleWindow) // as before
	rssAfter, err := p.rssMiB()
	if err != nil {
		return nil, err
	}
	if err := p.stop(); err != nil {
		return nil, err
	}
	return []result{
		{metric: "manager RSS, the mirrors controller and one mirror, idle", value: rssBefore, unit: "MiB"},
		{metric: fmt.Sprintf("manager RSS after %d Pods in %d namespaces naming %d images through the mirror", pinsPods, pinsNamespaces, pinsImages+1),
			value: rssAfter, unit: "MiB", note: fmt.Sprintf("growth %.1f MiB (the budget: 30 MB, 28.6 MiB); Pods created in %.0f s", rssAfter-rssBefore, created.Seconds())},
		{metric: "seconds from the last Pod created until the pins name every image", value: settled.Seconds(), unit: "s",
			note: fmt.Sprintf("%d images, one reference each however many Pods name it", pinsImages+1)},
	}, nil
}

// waitFor polls cond every 200 ms until it holds or within passes.
func waitFor(ctx context.Context, within time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond): // polling interval
		}
	}
	return nil
}
