package mirrorcache

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/opencontainers/go-digest"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// The eviction rule as a table: least recently pulled first (ties by digest), pinned content
// never, until the bytes asked for are freed; a tag whose manifest goes is forgotten with it.
func TestEvictLeastRecentlyPulled(t *testing.T) {
	type item struct {
		name     string
		size     int
		age      time.Duration // since its last pull
		manifest bool
	}
	items := []item{
		{"old-manifest", 100, 3 * time.Hour, true},
		{"old-layer", 1000, 3 * time.Hour, false},
		{"mid-layer", 1000, 2 * time.Hour, false},
		{"new-layer", 1000, time.Hour, false},
		{"new-manifest", 100, time.Hour, true},
	}
	for name, tc := range map[string]struct {
		need   uint64
		pinned []string
		want   []string // evicted
	}{
		"nothing needed":                  {need: 0, want: nil},
		"the oldest until enough":         {need: 1050, want: []string{"old-layer", "old-manifest"}},
		"a pinned one is passed over":     {need: 1050, pinned: []string{"old-layer"}, want: []string{"mid-layer", "old-manifest"}},
		"more than there is: all but pin": {need: 1 << 30, pinned: []string{"new-manifest"}, want: []string{"mid-layer", "new-layer", "old-layer", "old-manifest"}},
	} {
		t.Run(name, func(t *testing.T) {
			clock := newFakeClock()
			s, err := openStore(t.TempDir(), clock.now)
			if err != nil {
				t.Fatal(err)
			}
			byName, names := map[string]digest.Digest{}, map[digest.Digest]string{}
			now := clock.now()
			for _, it := range items {
				b := randomBytes(it.size)
				d := digest.FromBytes(b)
				if err := os.WriteFile(s.path(d), b, 0o644); err != nil {
					t.Fatal(err)
				}
				clock.ns.Store(now.Add(-it.age).UnixNano())
				var meta *contentMeta
				if it.manifest {
					meta = &contentMeta{MediaType: "application/vnd.oci.image.manifest.v1+json"}
				}
				s.committed(d, meta)
				s.pulled("team/app", d, it.manifest)
				if it.manifest {
					s.setTag("team/app", it.name, d)
				}
				byName[it.name], names[d] = d, it.name
			}
			clock.ns.Store(now.UnixNano())
			pinned := func(d digest.Digest) bool { return slices.Contains(tc.pinned, names[d]) }
			n, freed := s.evict(tc.need, pinned)
			var got []string
			var wantFreed uint64
			for _, it := range items {
				_, err := os.Stat(s.path(byName[it.name]))
				gone := os.IsNotExist(err)
				if gone != (s.content(byName[it.name]) == nil) {
					t.Errorf("%s: file gone %v, but the index says otherwise", it.name, gone)
				}
				if gone {
					got = append(got, it.name)
					wantFreed += uint64(it.size)
				}
				if _, tagged := s.tag("team/app", it.name); it.manifest && tagged == gone {
					t.Errorf("%s: evicted %v, its tag kept %v", it.name, gone, tagged)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) || n != len(tc.want) || freed != wantFreed {
				t.Errorf("evicted %q (%d, %d bytes), want %q (%d bytes)", got, n, freed, tc.want, wantFreed)
			}
		})
	}
}

// A volume above its high-water mark: the cache deletes the least recently pulled image's
// content until it is under the low-water mark, keeps serving the newer image with the upstream
// down, and pulls the older one through again when the upstream is back.
func TestVolumeAboveHighWaterEvicts(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	older := up.pushImage(t, "team/older", []byte(`{"architecture":"amd64","os":"linux","older":1}`), randomBytes(1<<20))
	newer := up.pushImage(t, "team/newer", []byte(`{"architecture":"amd64","os":"linux","newer":1}`), randomBytes(1<<20))
	clock := newFakeClock()
	files := newCacheFiles(t, up.URL, "", "")
	// A volume of 4 MiB holding 1.5 MiB of something else besides the cache's content.
	const size, other = 4 << 20, 3 << 19
	used := func() uint64 {
		var n uint64
		_ = filepath.WalkDir(filepath.Join(files.storage, contentDir, "blobs"), func(_ string, e os.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				if info, err := e.Info(); err == nil {
					n += uint64(info.Size())
				}
			}
			return nil
		})
		return other + n
	}
	cache := startCacheWith(t, files, Options{now: clock.now, started: func(f *front) {
		f.volume = func() (uint64, uint64, error) { return size, size - min(used(), size), nil }
		f.reserve = 0 // reserveBytes is 64 MiB
	}})
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, cache.URL)

	before := cache.metrics(t)
	mustPull(t, hosts, older.byTag(up))
	// A fill commits (its last pull) once its client has every byte: the clock moves on after.
	waitStored(t, files, older.blobs[1].Digest)
	clock.advance(time.Minute)
	mustPull(t, hosts, newer.byTag(up)) // 3.5 MiB of 4 used: above 85%
	// Every 100 ms: the cache looks at its volume every flushInterval.
	testenv.PollFor(t, "the older image's layer to be evicted", 100*time.Millisecond, time.Minute, func() (bool, string) {
		return !stored(files, older.blobs[1].Digest), fmt.Sprintf("%d of %d bytes used", used(), size)
	})
	if !stored(files, newer.blobs[1].Digest) || used() > size*3/4 {
		t.Errorf("after eviction: the newer layer stored %v, %d of %d bytes used (want at most 75%%)", stored(files, newer.blobs[1].Digest), used(), size)
	}
	if d := delta(before, cache.metrics(t), `quartermaster_mirror_evicted_total`); d[`quartermaster_mirror_evicted_total`] < 1 {
		t.Errorf("metric changes %v, want the evictions counted", d)
	}

	up.stop()
	mustPull(t, hosts, newer.byTag(up))
	mustFail(t, hosts, older.byTag(up))
}

// The marks are the mirror's (spec.eviction, through the configuration file): a volume 75% used
// is left alone under the default marks and brought down to 40% under marks of 70/40.
func TestMarksOfTheConfiguration(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	var marks [2]float64
	startCacheWith(t, newCacheFilesOf(t, mirror.CacheParams{UpstreamURL: up.URL, HighWater: 70, LowWater: 40}, "", ""),
		Options{started: func(f *front) { marks = [2]float64{f.highWater, f.lowWater} }})
	if marks != [2]float64{0.70, 0.40} {
		t.Errorf("the cache's marks are %v, want the configuration's 0.70 and 0.40", marks)
	}

	for _, tc := range []struct {
		high, low float64
		want      int // blobs left of three
	}{{0.85, 0.75, 3}, {0.70, 0.40, 1}} {
		clock := newFakeClock()
		dir := t.TempDir()
		s, err := openStore(dir, clock.now)
		if err != nil {
			t.Fatal(err)
		}
		var blobs []digest.Digest
		for range 3 {
			b := randomBytes(1000)
			d := digest.FromBytes(b)
			if err := os.WriteFile(s.path(d), b, 0o644); err != nil {
				t.Fatal(err)
			}
			s.committed(d, nil)
			s.pulled("team/app", d, false)
			clock.advance(time.Minute)
			blobs = append(blobs, d)
		}
		f := newFront(nil, nil, s, 0, dir, logr.Discard())
		f.highWater, f.lowWater = tc.high, tc.low
		f.volume = func() (uint64, uint64, error) {
			var used uint64
			for _, d := range blobs {
				if s.content(d) != nil {
					used += 1000
				}
			}
			return 4000, 4000 - used, nil
		}
		f.bound()
		var left int
		for _, d := range blobs {
			if s.content(d) != nil {
				left++
			}
		}
		if left != tc.want || (left > 0 && s.content(blobs[2]) == nil) {
			t.Errorf("marks %v/%v: %d of 3 blobs left (the newest kept: %v), want %d", tc.high, tc.low, left, s.content(blobs[2]) != nil, tc.want)
		}
	}
}

// waitStored waits until the fill of d has committed it.
func waitStored(t *testing.T, files cacheFiles, d digest.Digest) {
	t.Helper()
	testenv.PollFor(t, fmt.Sprintf("%s to be stored", d), 10*time.Millisecond, time.Minute, func() (bool, string) {
		return stored(files, d), "not stored"
	})
}

// The volume is measured as df measures it (its Use% is what the marks are of): the blocks
// reserved for root count neither as used nor as the cache's. On this machine's disk, whose root
// reserve is large, counting them as used put the volume above 85% and evicted everything.
func TestVolumeIsMeasuredAsDf(t *testing.T) {
	dir := t.TempDir()
	f := newFront(nil, nil, &store{root: dir}, 0, dir, logr.Discard())
	size, free, err := f.volume()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("df", "-B1", "--output=used,avail", dir).Output()
	if err != nil {
		t.Fatalf("df: %v", err)
	}
	fields := strings.Fields(string(out))
	used, err1 := strconv.ParseUint(fields[len(fields)-2], 10, 64)
	avail, err2 := strconv.ParseUint(fields[len(fields)-1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("df said %q", out)
	}
	const slack = 64 << 20 // other writers between the two looks
	if diff(size-free, used) > slack || diff(free, avail) > slack {
		t.Errorf("the cache measures %d used, %d free; df says %d used, %d available", size-free, free, used, avail)
	}
}

func diff(a, b uint64) uint64 { return max(a, b) - min(a, b) }

// What a fill may use of the volume: all but the reserve, which on a small volume is at most half
// of what lies above the high-water mark (a fixed 64 MiB on a 160 MiB volume would stop fills from
// storing at 60% used, and eviction, at 85%, would never make room).
func TestRoomKeepsTheReserveUnderTheHighWaterMark(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		total, free, want uint64
	}{
		{total: 1 << 40, free: 100 * mib, want: 36 * mib},  // the full 64 MiB reserve
		{total: 160 * mib, free: 60 * mib, want: 48 * mib}, // 12 MiB: half of the 15% above 85%
		{total: 160 * mib, free: 10 * mib, want: 0},        // under the reserve: no room
	} {
		dir := t.TempDir()
		f := newFront(nil, nil, &store{root: dir}, 0, dir, logr.Discard())
		f.volume = func() (uint64, uint64, error) { return tc.total, tc.free, nil }
		got, err := f.room()
		if err != nil || got != tc.want {
			t.Errorf("volume %d MiB, %d MiB free: room %d MiB (%v), want %d MiB", tc.total/mib, tc.free/mib, got/mib, err, tc.want/mib)
		}
	}
}
