package mirrorcache

import (
	"errors"
	"io/fs"
	"os"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// pins is the mirror's pins file (mirror.Pins) as the cache uses it: each repository's pinned tags
// and digests. What they hold is never expired (store.sweep) or evicted (store.evict).
type pins struct {
	repos map[string][]string // repository → tags and digests ("sha256:…")
	count int
	// platforms are the cluster's nodes' platforms ("linux/amd64"): of an index, the warm fetches
	// each one's manifest; none: the pod's own.
	platforms []string
}

func newPins(p mirror.Pins) (*pins, error) {
	out := &pins{repos: map[string][]string{}, platforms: p.Platforms}
	for _, ref := range p.Refs() {
		repo, tag, dig, err := mirror.SplitPin(ref)
		if err != nil {
			return nil, err
		}
		out.repos[repo] = append(out.repos[repo], tag+dig) // one of them is empty
		out.count++
	}
	return out, nil
}

// loadPins reads the pins file if it changed since the last look. A file that cannot be read or
// parsed keeps the last pins (content is never released on a bad file); a file that is gone (the
// ConfigMap deleted: pinning off, the mirror going) pins nothing.
func (f *front) loadPins() {
	if f.pinsPath == "" {
		return
	}
	info, err := os.Stat(f.pinsPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if f.pinsSeen != nil || f.pins.Load() != nil {
			f.pinsSeen, f.pinsHash, f.pinnedBytes = nil, "", 0
			f.pins.Store(nil)
			pinnedImages.Set(0)
			pinnedBytes.Set(0)
			f.log.Info("the pins file is gone: nothing is pinned", "path", f.pinsPath)
		}
		return
	case err != nil:
		f.log.Error(err, "reading the pins file: keeping the last pins", "path", f.pinsPath)
		return
	}
	if last := f.pinsSeen; last != nil && os.SameFile(last, info) && last.ModTime().Equal(info.ModTime()) && last.Size() == info.Size() {
		return
	}
	b, err := os.ReadFile(f.pinsPath)
	if err != nil {
		f.log.Error(err, "reading the pins file: keeping the last pins", "path", f.pinsPath)
		return
	}
	f.pinsSeen = info // a bad file is reported once, not at every look
	parsed, err := mirror.ParsePins(b)
	var p *pins
	if err == nil {
		p, err = newPins(parsed)
	}
	if err != nil {
		f.log.Error(err, "the pins file does not parse: keeping the last pins", "path", f.pinsPath)
		return
	}
	f.pins.Store(p)
	f.pinsHash = mirror.PinsHash(b)
	pinnedImages.Set(float64(p.count))
	f.pinnedBytesAt = time.Time{} // counted again at the next look
	f.log.Info("pins read", "images", p.count)
}

// pinnedSet is the content the pins hold in the index: each pinned tag's or digest's content and,
// through the references of the manifests among it, every manifest and blob it needs.
func (s *store) pinnedSet(p *pins) map[digest.Digest]bool {
	if p == nil || p.count == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	set := map[digest.Digest]bool{}
	var visit func(d digest.Digest)
	visit = func(d digest.Digest) {
		if set[d] {
			return
		}
		c := s.idx.Content[d]
		if c == nil {
			return
		}
		set[d] = true
		for _, ref := range c.Refs {
			visit(ref)
		}
	}
	for repo, refs := range p.repos {
		r := s.idx.Repos[repo]
		for _, ref := range refs {
			if d, err := digest.Parse(ref); err == nil {
				visit(d)
			} else if r != nil {
				if d, ok := r.Tags[ref]; ok {
					visit(d)
				}
			}
		}
	}
	return set
}

// bytesOf is the size of the content in set that is stored.
func (s *store) bytesOf(set map[digest.Digest]bool) uint64 {
	var n uint64
	for d := range set {
		if info, err := os.Stat(s.path(d)); err == nil {
			n += uint64(info.Size()) //nolint:gosec // a file's size is not negative
		}
	}
	return n
}

// pinnedBytesEvery is how often the pinned content's size is counted when nothing else asks.
const pinnedBytesEvery = 30 * time.Second

// countPinned sets the pinned content's gauges, and says (once per change) when pinned content
// alone is above the volume's high-water mark: eviction cannot bring the volume under it.
func (f *front) countPinned(set map[digest.Digest]bool, total uint64) {
	n := f.store.bytesOf(set)
	f.pinnedBytesAt, f.pinnedBytes = time.Now(), n
	pinnedBytes.Set(float64(n))
	over := total > 0 && float64(n) > f.highWater*float64(total)
	if over != f.pinnedOver {
		f.pinnedOver = over
		if over {
			pinnedOverHighWater.Set(1)
			f.log.Info("pinned content alone is above the volume's high-water mark: eviction cannot bring the volume under it; give the mirror a larger volume",
				"pinned", n, "size", total, "highWater", f.highWater)
		} else {
			pinnedOverHighWater.Set(0)
			f.log.Info("pinned content is under the volume's high-water mark again", "pinned", n, "size", total)
		}
	}
}
