package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cacheReplicas is how many cache pods the replicas case runs: a mirror's replicas, as
// processes, pulled through one address that spreads connections over them.
const cacheReplicas = 3

// cacheReplicasBench measures a mirror's replicas acting as one cache (docs/mirrors.md,
// Replicas): the same paced upstream and image as mirrors/cache-data-path, 50 cold pullers
// spread over 3 replicas by a stand-in for the Service; the same with peering off (each replica
// on its own, as before); and the same with one replica killed (SIGKILL) once the upstream has
// sent a third of the image, the pullers reopening cut bodies as containerd does.
func cacheReplicasBench(ctx context.Context, _ *env) ([]result, error) {
	b, err := startCacheBench(ctx)
	if err != nil {
		return nil, err
	}
	defer b.close()
	work, qm, up, img, direct := b.work, b.bin, b.up, b.img, b.direct
	size := float64(img.size)

	// One rollout over fresh replicas; kill, when set, is the replica killed once the upstream
	// sent a third of the image.
	type rollout struct {
		took     time.Duration
		failed   []error
		upstream float64 // bytes / image
		warm     time.Duration
		peerFail float64 // the survivors' requests to a peer that failed (refused, cut …)
	}
	run := func(name string, peering bool, kill int) (rollout, error) {
		var ro rollout
		rs, err := startReplicas(qm, up.url, filepath.Join(work, name), peering)
		if err != nil {
			return ro, err
		}
		defer func() {
			for _, r := range rs {
				r.stop()
			}
		}()
		svc, err := startService(rs)
		if err != nil {
			return ro, err
		}
		defer svc.close()
		up.bytes.Store(0)
		killed := make(chan struct{})
		if kill >= 0 {
			go func() {
				defer close(killed)
				for up.bytes.Load() < img.size/3 {
					time.Sleep(2 * time.Millisecond) // polling the upstream's byte count
				}
				_ = rs[kill].cmd.Process.Kill()
				<-rs[kill].done
			}()
		} else {
			close(killed)
		}
		ro.took, ro.failed = pullAll(ctx, cacheColdPullers, svc.url, img)
		<-killed
		ro.upstream = float64(up.bytes.Load()) / size
		for i, r := range rs {
			if i != kill {
				for _, result := range []string{"error", "unreachable", "stalled", "cut", "digest_mismatch"} {
					ro.peerFail += r.metric(`quartermaster_mirror_peer_requests_total{result="` + result + `"}`)
				}
			}
		}
		// The floor's second part: the same pullers served by the warm replicas, best of three
		// (a slow run would flatter the cold figure).
		for range 3 {
			if len(ro.failed) > 0 || err != nil {
				break
			}
			var warm time.Duration
			if warm, err = pullers(ctx, cacheColdPullers, svc.url, img); err == nil && (ro.warm == 0 || warm < ro.warm) {
				ro.warm = warm
			}
		}
		var logs []string
		for _, r := range rs {
			logs = append(logs, r.logs.Tail(2000))
		}
		if err != nil {
			return ro, fmt.Errorf("%s: %w\n%s", name, err, strings.Join(logs, "\n"))
		}
		return ro, nil
	}
	one, err := run("peering", true, -1)
	if err != nil {
		return nil, err
	}
	if len(one.failed) > 0 {
		return nil, fmt.Errorf("cold pulls over the replicas: %w", errors.Join(one.failed...))
	}
	alone, err := run("no-peering", false, -1)
	if err != nil {
		return nil, err
	}
	if len(alone.failed) > 0 {
		return nil, fmt.Errorf("cold pulls over the replicas without peering: %w", errors.Join(alone.failed...))
	}
	killed, err := run("one-killed", true, 1)
	if err != nil {
		return nil, err
	}
	floor := max(direct, one.warm)
	return []result{
		{metric: fmt.Sprintf("upstream bytes / image, %d pullers over %d cold replicas (%d MiB image, upstream %d MB/s)", cacheColdPullers, cacheReplicas, img.size>>20, cacheUpstreamRate>>20),
			value: one.upstream, unit: "x", note: fmt.Sprintf("%.3fx, must be <= 1.05; each replica on its own (peering off): %.3fx", one.upstream, alone.upstream)},
		{metric: fmt.Sprintf("last of %d cold pullers over %d replicas done", cacheColdPullers, cacheReplicas), value: one.took.Seconds(), unit: "s",
			note: fmt.Sprintf("%.2fx the floor %.2f s (must be <= 1.3; one client from the upstream %.2f s, %d pullers of the warm replicas %.2f s, best of 3); peering off %.2f s",
				one.took.Seconds()/floor.Seconds(), floor.Seconds(), direct.Seconds(), cacheColdPullers, one.warm.Seconds(), alone.took.Seconds())},
		{metric: fmt.Sprintf("one of %d replicas killed at a third of the image: failed pulls", cacheReplicas), value: float64(len(killed.failed)), unit: "pulls",
			note: fmt.Sprintf("upstream bytes %.3fx the image; last puller %.2f s, %.2fx the floor; %.0f requests of the survivors to a peer failed (each fell back)%s",
				killed.upstream, killed.took.Seconds(), killed.took.Seconds()/floor.Seconds(), killed.peerFail, firstError(killed.failed))},
	}, nil
}

func firstError(errs []error) string {
	if len(errs) == 0 {
		return ""
	}
	return "; first failure: " + errs[0].Error()
}

// startReplicas runs cacheReplicas caches of upstream as processes, with a fixed peer list when
// peering (as the headless Service's SRV records give it in a cluster).
func startReplicas(bin, upstream, dir string, peering bool) ([]*registryProcess, error) {
	var names, addrs, list []string
	for i := range cacheReplicas {
		addr, err := freePort()
		if err != nil {
			return nil, err
		}
		names, addrs = append(names, "mirror-bench-"+strconv.Itoa(i)), append(addrs, addr)
		list = append(list, names[i]+"="+addr)
	}
	var rs []*registryProcess
	for i := range cacheReplicas {
		var args []string
		if peering {
			args = []string{"--peers=" + strings.Join(list, ","), "--peer-name=" + names[i], "--peer-address=" + addrs[i]}
		}
		r, err := startCacheProcess(bin, upstream, filepath.Join(dir, names[i]), args...)
		if err != nil {
			for _, r := range rs {
				r.stop()
			}
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// service stands in for the mirror's Service as kube-proxy runs it: each connection goes to the
// next replica in turn, and a replica that refuses connections is skipped (kube-proxy drops a
// gone pod's endpoint).
type service struct {
	url      string
	ln       net.Listener
	backends []string
	next     atomic.Uint64
	wg       sync.WaitGroup
}

func startService(rs []*registryProcess) (*service, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &service{url: "http://" + ln.Addr().String(), ln: ln}
	for _, r := range rs {
		s.backends = append(s.backends, strings.TrimPrefix(r.url, "http://"))
	}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() { s.forward(c) })
		}
	})
	return s, nil
}

func (s *service) forward(c net.Conn) {
	defer c.Close()
	for range s.backends {
		b, err := net.DialTimeout("tcp", s.backends[s.next.Add(1)%uint64(len(s.backends))], time.Second)
		if err != nil {
			continue
		}
		defer b.Close()
		done := make(chan struct{})
		go func() {
			_, _ = io.Copy(b, c)
			b.Close() // the client left: so does its connection to the replica
			close(done)
		}()
		_, _ = io.Copy(c, b)
		// The replica ended (or died): the client's connection ends with it.
		c.Close()
		<-done
		return
	}
}

func (s *service) close() {
	s.ln.Close()
	s.wg.Wait()
}
