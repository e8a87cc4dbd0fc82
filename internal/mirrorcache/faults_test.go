package mirrorcache

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// A cache killed (SIGKILL) while a fill runs leaves a partial file behind; the cache restarted
// on the same volume serves none of it and fetches the blob again, whole.
func TestCacheKilledMidFill(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	layer := randomBytes(2 << 20)
	up.pushImage(t, "team/app", []byte(`{}`), layer)
	files := newCacheFiles(t, up.URL, "", "")
	g := newGate(layer, serveWhole)
	up.setFault(g.fault)

	child := startChild(t, files)
	addr := child.addr
	blobURL := "http://" + addr + "/v2/team/app/blobs/" + g.d.String()
	resp := getFrom(context.Background(), t, blobURL, "", http.StatusOK)
	if resp == nil {
		t.FailNow()
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<19)); err != nil {
		t.Fatalf("the fill did not start: %v", err)
	}
	if err := child.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-child.exited
	resp.Body.Close()
	close(g.release)
	tmp, _ := os.ReadDir(filepath.Join(files.storage, contentDir, "tmp"))
	if len(tmp) != 1 {
		t.Fatalf("want the killed fill's partial file, found %v", tmp)
	}
	if stored(files, g.d) {
		t.Fatal("a partial blob was committed")
	}

	restarted := startCache(t, files)
	assertNotStored(t, files, g.d) // the partial file is gone before anything is served
	resp = getFrom(context.Background(), t, restarted.URL+"/v2/team/app/blobs/"+g.d.String(), "", http.StatusOK)
	if resp == nil {
		t.FailNow()
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(b, layer) {
		t.Fatalf("after the restart: %d bytes (%v), not the blob", len(b), err)
	}
	if n := count(up.requests(), "GET /v2/team/app/blobs/"+g.d.String()); n != 2 {
		t.Errorf("the upstream served the blob %d times, want 2 (the killed fill and the new one)", n)
	}
}

// childCache is a cache run as its own process (the test binary; see TestMain).
type childCache struct {
	cmd               *exec.Cmd
	addr, metricsAddr string
	exited            chan struct{} // closed when it is gone
	logs              *testenv.LogBuffer
}

func startChild(t *testing.T, files cacheFiles, env ...string) *childCache {
	t.Helper()
	c := &childCache{addr: freeAddr(t), metricsAddr: freeAddr(t), exited: make(chan struct{}), logs: &testenv.LogBuffer{}}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Stdout, c.cmd.Stderr = c.logs, c.logs
	c.cmd.Env = append(append(os.Environ(), envChildCache+"="+files.config,
		envChildAddr+"="+c.addr, envChildMetricsAddr+"="+c.metricsAddr, envChildStorage+"="+files.storage), env...)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.exited
	})
	waitReady(t, "http://"+c.addr, c.exited, c.logs)
	return c
}

// metrics scrapes the child's metrics like runningCache.metrics.
func (c *childCache) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	return (&runningCache{MetricsURL: "http://" + c.metricsAddr + mirror.MetricsPath}).metrics(t)
}

// A volume that refuses a write mid-fill (the kernel's EFBIG past a file size limit, as ENOSPC
// from a full disk): that fill's clients get an error, nothing is kept, store_full says so, and
// the next pulls are streamed from the upstream, whole and right.
func TestVolumeRefusesWrites(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	layer := randomBytes(3 << 20)
	up.pushImage(t, "team/app", []byte(`{}`), layer)
	files := newCacheFiles(t, up.URL, "", "")
	child := startChild(t, files, envChildFileLimit+"="+fmt.Sprint(1<<20))
	blobURL := "http://" + child.addr + "/v2/team/app/blobs/" + digest.FromBytes(layer).String()

	// The fill's client gets a 503, or a 200 cut short when the write failed after its headers.
	resp, err := testClient.Get(blobURL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK && err == nil {
		t.Errorf("a complete answer of %d bytes from a fill the volume refused", len(b))
	} else if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("the fill's client got %s, want 503 or a cut 200", resp.Status)
	}
	m := child.metrics(t)
	if m[storeFullSeries] != 1 || m[`quartermaster_mirror_store_errors_total`] < 1 {
		t.Errorf("store_full %v, store_errors %v: want 1 and at least 1", m[storeFullSeries], m[`quartermaster_mirror_store_errors_total`])
	}
	for range 2 {
		resp = getFrom(context.Background(), t, blobURL, "", http.StatusOK)
		if resp == nil {
			t.FailNow()
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(b, layer) {
			t.Fatalf("after the refused write: %d bytes (%v), not the blob", len(b), err)
		}
	}
	if d := child.metrics(t)[blobPassThrough]; d != 2 {
		t.Errorf("%s = %v, want 2", blobPassThrough, d)
	}
	assertNotStored(t, files, digest.FromBytes(layer))
}

func freeAddr(t *testing.T) string {
	ln := listenLoopback(t)
	defer ln.Close()
	return ln.Addr().String()
}

func waitReady(t *testing.T, url string, exited chan struct{}, logs *testenv.LogBuffer) {
	t.Helper()
	testenv.PollFor(t, "the cache to be ready", 10*time.Millisecond, 20*time.Second, func() (bool, string) {
		select {
		case <-exited:
			t.Fatalf("the cache exited\n%s", logs)
		default:
		}
		return readyz(url), "logs:\n" + logs.String()
	})
}

// With the volume full, pulls are streamed from the upstream (not stored) and the store_full
// metric says so; once there is room again, content is cached again and the metric clears.
func TestVolumeFull(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	img := up.push(t, "team/app")
	files := newCacheFiles(t, up.URL, "", "")
	var free atomic.Uint64 // what the volume reports free: 0 is full
	cache := startCacheWith(t, files, Options{started: func(f *front) {
		f.volume = func() (uint64, uint64, error) { return 1 << 40, free.Load(), nil }
	}})
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, cache.URL)

	before := cache.metrics(t)
	mustPull(t, hosts, img.byTag(up))
	after := cache.metrics(t)
	// Each request counted once, as served: passed through, not also a miss or a coalesced.
	if d := delta(before, after, blobPassThrough, blobMisses, blobCoalesced, fillsNoSpace); d[blobPassThrough] != 2 || d[blobMisses]+d[blobCoalesced] != 0 ||
		d[fillsNoSpace] < 2 || after[storeFullSeries] != 1 {
		t.Errorf("metric changes %v, store_full %v: want the blobs passed through (and counted nothing else), fills refused for space, store_full 1", d, after[storeFullSeries])
	}
	for _, d := range img.blobs {
		if stored(files, d.Digest) {
			t.Errorf("%s was stored on a full volume", d.Digest)
		}
	}
	mustPull(t, hosts, img.byTag(up)) // still served, from the upstream

	free.Store(1 << 40)
	mustPull(t, hosts, img.byTag(up))
	// A response ends once the digest is checked, before the fill's commit (its fsync): the
	// fills end after the pull.
	waitMetric(t, cache, fillsInFlightSeries, func(v float64) bool { return v == 0 })
	if m := cache.metrics(t); m[storeFullSeries] != 0 {
		t.Errorf("store_full is %v after content was stored again", m[storeFullSeries])
	}
	for _, d := range img.blobs {
		if !stored(files, d.Digest) {
			t.Errorf("%s was not stored once there was room", d.Digest)
		}
	}
}
