package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// floorWrites measures how fast a bare client writes objects to this cluster: the floor every
// controller's throughput is compared with in the same report.
func floorWrites(ctx context.Context, e *env) ([]result, error) {
	var out []result
	for _, tc := range []struct{ writers, objects int }{{1, 300}, {16, 1600}} {
		rate, err := writeConfigMaps(ctx, e, tc.writers, tc.objects)
		if err != nil {
			return nil, err
		}
		out = append(out, result{
			metric: fmt.Sprintf("creates, %d writer(s)", tc.writers),
			value:  rate, unit: "objects/s",
			note: fmt.Sprintf("%d ConfigMaps", tc.objects),
		})
	}
	return out, nil
}

// writeConfigMaps creates n ConfigMaps in a fresh namespace with the given number of concurrent
// writers and returns objects per second.
func writeConfigMaps(ctx context.Context, e *env, writers, n int) (float64, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-floor-"}}
	if err := e.client.Create(ctx, ns); err != nil {
		return 0, err
	}
	defer func() { _ = e.client.Delete(ctx, ns) }()

	start := time.Now()
	err := parallel(writers, n, func(i int) error {
		return e.client.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("cm-%05d", i)},
			Data:       map[string]string{"k": "v"},
		})
	})
	if err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	return float64(n) / elapsed.Seconds(), nil
}
