package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// What a mirror keeps (docs/mirrors.md, Performance): pulls served while the upstream refuses
// every request, and eviction under churn of a volume smaller than what goes through it.

// refusingPullers pull at once from a warm cache whose upstream answers 429 to everything.
const refusingPullers = 50

// refusingUpstreamBench: the cache warm (one pull of the bench image), the upstream starts
// answering every request 429 (Docker Hub's rate limit): 50 pullers at once must all succeed, by
// tag, from the cache's last answer. The floor: the same 50 pullers of the warm cache, the
// upstream answering.
func refusingUpstreamBench(ctx context.Context, _ *env) ([]result, error) {
	b, err := startCacheBench(ctx)
	if err != nil {
		return nil, err
	}
	defer b.close()
	ours, err := startCacheProcess(b.bin, b.up.url, filepath.Join(b.work, "ours"))
	if err != nil {
		return nil, err
	}
	defer ours.stop()
	if _, err := pullers(ctx, 1, ours.url, b.img); err != nil {
		return nil, fmt.Errorf("warming the cache: %w", err)
	}
	floor, err := pullers(ctx, refusingPullers, ours.url, b.img)
	if err != nil {
		return nil, err
	}
	const fallbacks = `quartermaster_mirror_tag_fallbacks_total{reason="rate_limited"}`
	before := ours.metric(fallbacks)
	b.up.refuse.Store(http.StatusTooManyRequests)
	took, failed := pullAll(ctx, refusingPullers, ours.url, b.img)
	note := fmt.Sprintf("must be 0; %.0f pulls by tag answered from the cache's last answer, %d requests the upstream refused", ours.metric(fallbacks)-before, b.up.refused.Load())
	if len(failed) > 0 {
		note += "; first failure: " + failed[0].Error()
	}
	return []result{
		{metric: fmt.Sprintf("failed pulls of %d pullers of a warm cache, the upstream answering 429 to every request", refusingPullers),
			value: float64(len(failed)), unit: "pulls", note: note},
		{metric: "… last of them done", value: took.Seconds(), unit: "s",
			note: fmt.Sprintf("%.2fx the same pullers with the upstream answering (%.2f s)", took.Seconds()/floor.Seconds(), floor.Seconds())},
	}, nil
}

// Eviction under churn: a cache volume of churnVolume (a tmpfs of that size), a working set of
// churnHot images pulled after every new image, one image pinned, and churnImages new images
// whose content is twice the volume, each pulled once.
const (
	churnVolume     = 160 << 20
	churnLayers     = 2
	churnLayerBytes = 6 << 20
	churnHot        = 3
	churnImages     = 27 // × 12 MiB: about twice the volume
)

// evictionChurnBench: every pull must succeed, the working set keep being served from the cache
// (its hit ratio: the pulls of it the upstream sent no byte for), the pinned image never be
// evicted (pulled with the upstream refusing everything at the end), and the volume stay under
// its high-water mark (eviction, not pass-through, making room).
func evictionChurnBench(ctx context.Context, _ *env) ([]result, error) {
	b, err := startCacheBench(ctx)
	if err != nil {
		return nil, err
	}
	defer b.close()
	vol := filepath.Join(b.work, "volume")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		return nil, err
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", churnVolume), "qm-bench-churn", vol).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mounting a %d MiB tmpfs as the cache's volume (the case needs root): %w: %s", churnVolume>>20, err, out)
	}
	defer func() { _ = exec.Command("umount", "-l", vol).Run() }()

	push := func(repo string) (*benchImage, error) {
		return pushImageOf(b.up.url, repo, churnLayers, churnLayerBytes)
	}
	pinned, err := push("bench/pinned")
	if err != nil {
		return nil, err
	}
	hot := make([]*benchImage, churnHot)
	for i := range hot {
		if hot[i], err = push(fmt.Sprintf("bench/hot-%d", i)); err != nil {
			return nil, err
		}
	}
	churn := make([]*benchImage, churnImages)
	for i := range churn {
		if churn[i], err = push(fmt.Sprintf("bench/churn-%02d", i)); err != nil {
			return nil, err
		}
	}
	pins := filepath.Join(b.work, mirror.PinsFile)
	pinsJSON, err := json.Marshal(mirror.Pins{Images: map[string]string{pinned.repo + ":" + pinned.tag: ""}})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(pins, pinsJSON, 0o644); err != nil {
		return nil, err
	}
	ours, err := startCacheProcess(b.bin, b.up.url, filepath.Join(b.work, "ours"), "--storage-dir="+filepath.Join(vol, "storage"), "--pins="+pins)
	if err != nil {
		return nil, err
	}
	defer ours.stop()

	var failed []error
	pull := func(img *benchImage) (upstreamBytes int64) {
		before := b.up.bytes.Load()
		if _, errs := pullAll(ctx, 1, ours.url, img); len(errs) > 0 {
			failed = append(failed, errs...)
		}
		return b.up.bytes.Load() - before
	}
	pull(pinned)
	for _, h := range hot {
		pull(h)
	}
	var through, hotPulls, hotHits int64
	start := time.Now()
	for _, c := range churn {
		through += pull(c)
		for _, h := range hot {
			hotPulls++
			if pull(h) == 0 {
				hotHits++
			}
		}
	}
	took := time.Since(start)
	evicted := ours.metric("quartermaster_mirror_evicted_total")
	// The pinned image, with the upstream refusing everything: from the cache alone.
	b.up.refuse.Store(http.StatusServiceUnavailable)
	pinnedLost := ""
	if _, errs := pullAll(ctx, 1, ours.url, pinned); len(errs) > 0 {
		pinnedLost = errs[0].Error()
	}
	b.up.refuse.Store(0)
	note := fmt.Sprintf("must be 0; %d MiB pulled through a %d MiB volume in %.1f s, %.0f manifests and blobs evicted",
		through>>20, churnVolume>>20, took.Seconds(), evicted)
	if len(failed) > 0 {
		note += "; first failure: " + failed[0].Error()
	}
	if evicted == 0 {
		return nil, errors.New("nothing was evicted: the churn did not fill the volume")
	}
	pinnedNote := "served from the cache alone after the churn, the upstream refusing (must be)"
	if pinnedLost != "" {
		pinnedNote = "LOST: " + pinnedLost
	}
	return []result{
		{metric: fmt.Sprintf("failed pulls, %d new images (%d MiB) through a %d MiB volume, a working set of %d pulled after each", churnImages, int64(churnImages)*int64(churnLayers*churnLayerBytes)>>20, churnVolume>>20, churnHot),
			value: float64(len(failed)), unit: "pulls", note: note},
		{metric: "working set's hit ratio (pulls the upstream sent no byte for)", value: float64(hotHits) / float64(hotPulls), unit: "",
			note: fmt.Sprintf("%d of %d pulls", hotHits, hotPulls)},
		{metric: "pinned image after the churn", value: map[bool]float64{true: 1, false: 0}[pinnedLost == ""], unit: "",
			note: pinnedNote},
	}, nil
}

// rolloutWarmPulls is how many warm pulls give the floor (their median).
const rolloutWarmPulls = 5

// prewarmRolloutBench: a rollout of a new image after pre-warming. The cache runs with an empty
// pins file; the rollout's template starts naming the bench image, which the pins file then names
// (as the controller writes it), and the cache warms it (its warmed counter says when). The first
// Pod's pull of the image, as the kubelet makes it, is measured against the same pull served warm
// (the median of rolloutWarmPulls more): within 1.2x, and no byte of it from the upstream. For
// scale, the same pull of a second image of the same size that nothing pinned (cold, through the
// cache, at the upstream's pace).
func prewarmRolloutBench(ctx context.Context, _ *env) ([]result, error) {
	b, err := startCacheBench(ctx)
	if err != nil {
		return nil, err
	}
	defer b.close()
	cold, err := pushImageOf(b.up.url, "bench/not-prewarmed", cacheLayers, cacheLayerBytes)
	if err != nil {
		return nil, err
	}
	pins := filepath.Join(b.work, mirror.PinsFile)
	writePins := func(p mirror.Pins) error {
		j, err := json.Marshal(p)
		if err != nil {
			return err
		}
		// As the kubelet updates a mounted ConfigMap: a new file swapped in.
		tmp := pins + ".new"
		if err := os.WriteFile(tmp, j, 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, pins)
	}
	if err := writePins(mirror.Pins{Images: map[string]string{}}); err != nil {
		return nil, err
	}
	ours, err := startCacheProcess(b.bin, b.up.url, filepath.Join(b.work, "ours"), "--pins="+pins)
	if err != nil {
		return nil, err
	}
	defer ours.stop()

	const warmed = `quartermaster_mirror_pins_warmed_total{result="ok"}`
	start := time.Now()
	if err := writePins(mirror.Pins{Images: map[string]string{b.img.repo + ":" + b.img.tag: ""}}); err != nil {
		return nil, err
	}
	for ours.metric(warmed) < 1 {
		if time.Since(start) > 2*time.Minute {
			return nil, errors.New("the pinned image was not warmed within 2 minutes:\n" + ours.logs.String())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling the cache's counter
		}
	}
	warming := time.Since(start)

	before := b.up.bytes.Load()
	first, err := pullers(ctx, 1, ours.url, b.img)
	if err != nil {
		return nil, fmt.Errorf("the first pull: %w", err)
	}
	fromUpstream := b.up.bytes.Load() - before
	warm := make([]time.Duration, rolloutWarmPulls)
	for i := range warm {
		if warm[i], err = pullers(ctx, 1, ours.url, b.img); err != nil {
			return nil, err
		}
	}
	slices.Sort(warm)
	median := warm[len(warm)/2]
	coldPull, err := pullers(ctx, 1, ours.url, cold)
	if err != nil {
		return nil, fmt.Errorf("the pull of the image nothing pinned: %w", err)
	}
	mib := cacheLayers * cacheLayerBytes >> 20
	return []result{
		{metric: fmt.Sprintf("first pull of a %d MiB image pre-warmed for its rollout, against the same pull served warm", mib),
			value: first.Seconds() / median.Seconds(), unit: "x",
			note: fmt.Sprintf("must be ≤ 1.2; %.3f s against the median of %d warm pulls %.3f s; %d bytes of it from the upstream (must be 0)",
				first.Seconds(), rolloutWarmPulls, median.Seconds(), fromUpstream)},
		{metric: "… time from the pins naming it to the cache holding it", value: warming.Seconds(), unit: "s",
			note: fmt.Sprintf("the upstream paced at %d MiB/s; the cache looks at its pins every 2 s", cacheUpstreamRate>>20)},
		{metric: "… the same pull of an image nothing pre-warmed", value: coldPull.Seconds(), unit: "s",
			note: fmt.Sprintf("%.1fx the pre-warmed first pull", coldPull.Seconds()/first.Seconds())},
	}, nil
}
