package mirrorcache

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
)

// store is the cache's content on its volume: committed content by digest (blobs and manifests
// alike), fills in progress under tmp/ (cleared at start, so a cache killed mid-fill serves
// nothing partial: content appears in blobs/ only by a rename after its digest was checked), and
// an index of what each repository may be served and when it was last pulled.
//
// Content is shared by all repositories; a repository is served content it was seen to have
// (fetched for it, confirmed by an upstream HEAD, or referenced by one of its manifests).
type store struct {
	root string
	now  func() time.Time

	mu    sync.Mutex
	idx   index
	dirty bool
}

// index is persisted as index.json (rewritten atomically, at most every flushInterval).
type index struct {
	Content map[digest.Digest]*contentMeta `json:"content"`
	Repos   map[string]*repoMeta           `json:"repos"`
}

type contentMeta struct {
	LastPull time.Time `json:"lastPull"`
	// Manifests only: their media type and the digests they reference.
	MediaType string          `json:"mediaType,omitempty"`
	Refs      []digest.Digest `json:"refs,omitempty"`
}

type repoMeta struct {
	Tags      map[string]digest.Digest    `json:"tags"`
	Manifests map[digest.Digest]time.Time `json:"manifests"` // last pull
	Blobs     map[digest.Digest]time.Time `json:"blobs"`     // last pull
}

func openStore(root string, now func() time.Time) (*store, error) {
	s := &store{root: root, now: now, idx: index{Content: map[digest.Digest]*contentMeta{}, Repos: map[string]*repoMeta{}}}
	// Partial fills of an earlier process are never committed: start clean.
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		return nil, err
	}
	for _, d := range []string{s.tmpDir(), filepath.Join(root, "blobs", "sha256")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	b, err := os.ReadFile(s.indexPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(b, &s.idx); err != nil {
			return nil, fmt.Errorf("%s: %w", s.indexPath(), err)
		}
	}
	if s.idx.Content == nil {
		s.idx.Content = map[digest.Digest]*contentMeta{}
	}
	if s.idx.Repos == nil {
		s.idx.Repos = map[string]*repoMeta{}
	}
	// Content committed after the last index write is known from its file (served to a
	// repository again only after the upstream confirms it); content the index names whose file
	// is gone is forgotten.
	entries, err := os.ReadDir(filepath.Join(root, "blobs", "sha256"))
	if err != nil {
		return nil, err
	}
	onDisk := map[digest.Digest]bool{}
	for _, e := range entries {
		d := digest.NewDigestFromEncoded(digest.SHA256, e.Name())
		if d.Validate() != nil {
			continue
		}
		onDisk[d] = true
		if s.idx.Content[d] == nil {
			s.idx.Content[d] = &contentMeta{LastPull: now()}
		}
	}
	for d := range s.idx.Content {
		if !onDisk[d] {
			delete(s.idx.Content, d)
		}
	}
	return s, nil
}

func (s *store) tmpDir() string    { return filepath.Join(s.root, "tmp") }
func (s *store) indexPath() string { return filepath.Join(s.root, "index.json") }

// path is where committed content lives.
func (s *store) path(d digest.Digest) string {
	return filepath.Join(s.root, "blobs", d.Algorithm().String(), d.Encoded())
}

func (s *store) repo(name string) *repoMeta {
	r := s.idx.Repos[name]
	if r == nil {
		r = &repoMeta{Tags: map[string]digest.Digest{}, Manifests: map[digest.Digest]time.Time{}, Blobs: map[digest.Digest]time.Time{}}
		s.idx.Repos[name] = r
	}
	return r
}

// open returns committed content, or nil when there is none.
func (s *store) open(d digest.Digest) *os.File {
	f, err := os.Open(s.path(d))
	if err != nil {
		return nil
	}
	return f
}

// committed records content just renamed into blobs/ (meta is nil for a blob).
func (s *store) committed(d digest.Digest, meta *contentMeta) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if meta == nil {
		meta = &contentMeta{}
	}
	meta.LastPull = s.now()
	s.idx.Content[d] = meta
	s.dirty = true
}

// content returns what the index knows of committed content (nil: nothing).
func (s *store) content(d digest.Digest) *contentMeta {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.idx.Content[d]; c != nil {
		cp := *c
		return &cp
	}
	return nil
}

// tag is the digest a repository's tag pointed to when last resolved.
func (s *store) tag(repo, tag string) (digest.Digest, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.idx.Repos[repo]
	if r == nil {
		return "", false
	}
	d, ok := r.Tags[tag]
	return d, ok
}

// tags are the tags repo's index holds (the last answer for each, resolved through this cache).
func (s *store) tags(repo string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.idx.Repos[repo]
	if r == nil {
		return nil
	}
	return slices.Collect(maps.Keys(r.Tags))
}

func (s *store) setTag(repo, tag string, d digest.Digest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.repo(repo)
	if r.Tags[tag] != d {
		r.Tags[tag] = d
		s.dirty = true
	}
}

// has reports whether repo may be served d without asking the upstream: fetched or confirmed for
// it, or referenced by one of its manifests (a registry holds every blob its manifests name).
func (s *store) has(repo string, d digest.Digest) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.idx.Repos[repo]
	if r == nil {
		return false
	}
	if _, ok := r.Manifests[d]; ok {
		return true
	}
	if _, ok := r.Blobs[d]; ok {
		return true
	}
	for m := range r.Manifests {
		if c := s.idx.Content[m]; c != nil {
			for _, ref := range c.Refs {
				if ref == d {
					return true
				}
			}
		}
	}
	return false
}

// pulled records a pull of d by repo: the time every ttl counts from.
func (s *store) pulled(repo string, d digest.Digest, manifest bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r := s.repo(repo)
	if manifest {
		r.Manifests[d] = now
	} else {
		r.Blobs[d] = now
	}
	if c := s.idx.Content[d]; c != nil {
		c.LastPull = now
	}
	s.dirty = true
}

// sweep forgets what was last pulled more than ttl ago and deletes content no longer needed: a
// repository keeps its manifests pulled within ttl (and the manifests they list); content is
// deleted only when no kept manifest of any repository references it and it was itself not
// pulled within ttl. Pinned content (pinnedSet's) counts as pulled now: it, the repositories'
// manifests and blob links to it, and the tags pointing to it stay. It returns the deleted
// content's count.
func (s *store) sweep(ttl time.Duration, pinned map[digest.Digest]bool) int {
	if ttl <= 0 {
		return 0
	}
	s.mu.Lock()
	now := s.now()
	fresh := func(t time.Time) bool { return now.Sub(t) < ttl }
	needed := map[digest.Digest]bool{}
	for name, r := range s.idx.Repos {
		keep := map[digest.Digest]bool{}
		var visit func(d digest.Digest)
		visit = func(d digest.Digest) {
			if keep[d] {
				return
			}
			keep[d] = true
			needed[d] = true
			if c := s.idx.Content[d]; c != nil {
				for _, ref := range c.Refs {
					needed[ref] = true
					if _, ok := r.Manifests[ref]; ok {
						visit(ref)
					}
				}
			}
		}
		for d, t := range r.Manifests {
			if fresh(t) || pinned[d] {
				visit(d)
			}
		}
		for _, d := range r.Tags {
			if pinned[d] {
				visit(d) // a pinned tag is kept with its manifest
			}
		}
		for d := range r.Manifests {
			if !keep[d] {
				delete(r.Manifests, d)
				s.dirty = true
			}
		}
		for tag, d := range r.Tags {
			if !keep[d] {
				delete(r.Tags, tag)
				s.dirty = true
			}
		}
		for d, t := range r.Blobs {
			if fresh(t) || pinned[d] {
				needed[d] = true
			} else {
				delete(r.Blobs, d)
				s.dirty = true
			}
		}
		if len(r.Manifests) == 0 && len(r.Blobs) == 0 && len(r.Tags) == 0 {
			delete(s.idx.Repos, name)
		}
	}
	var gone []digest.Digest
	for d, c := range s.idx.Content {
		if !needed[d] && !fresh(c.LastPull) && !pinned[d] {
			delete(s.idx.Content, d)
			gone = append(gone, d)
			s.dirty = true
		}
	}
	s.mu.Unlock()
	// A request that opened the file keeps reading it; a later one finds it gone and fills again.
	for _, d := range gone {
		_ = os.Remove(s.path(d))
	}
	return len(gone)
}

// evict deletes the least recently pulled content that pinned (nil: none; called with the store
// locked) does not hold until
// need bytes are freed or nothing is left to delete, and with it what the repositories' index
// says of it (a tag pointing to an evicted manifest is forgotten, as at expiry). It returns the
// count and bytes deleted. A request that opened a file keeps reading it (the space is freed
// when it closes); a later one fills it again.
func (s *store) evict(need uint64, pinned func(digest.Digest) bool) (int, uint64) {
	type candidate struct {
		d        digest.Digest
		lastPull time.Time
		size     uint64
	}
	s.mu.Lock()
	var lru []candidate
	for d, c := range s.idx.Content {
		if pinned == nil || !pinned(d) {
			lru = append(lru, candidate{d: d, lastPull: c.LastPull})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(lru, func(a, b candidate) int {
		if c := a.lastPull.Compare(b.lastPull); c != 0 {
			return c
		}
		return strings.Compare(string(a.d), string(b.d))
	})
	var chosen []candidate
	var sum uint64
	for _, c := range lru {
		if sum >= need {
			break
		}
		if info, err := os.Stat(s.path(c.d)); err == nil {
			c.size = uint64(info.Size()) //nolint:gosec // a file's size is not negative
		}
		sum += c.size
		chosen = append(chosen, c)
	}
	s.mu.Lock()
	var gone []digest.Digest
	var freed uint64
	evicted := map[digest.Digest]bool{}
	for _, c := range chosen {
		// Pulled since it was chosen: it stays (the next round counts again).
		if m := s.idx.Content[c.d]; m != nil && m.LastPull.Equal(c.lastPull) {
			delete(s.idx.Content, c.d)
			evicted[c.d] = true
			gone = append(gone, c.d)
			freed += c.size
		}
	}
	if len(gone) == 0 {
		s.mu.Unlock()
		return 0, 0
	}
	for name, r := range s.idx.Repos {
		maps.DeleteFunc(r.Manifests, func(d digest.Digest, _ time.Time) bool { return evicted[d] })
		maps.DeleteFunc(r.Blobs, func(d digest.Digest, _ time.Time) bool { return evicted[d] })
		maps.DeleteFunc(r.Tags, func(_ string, d digest.Digest) bool { return evicted[d] })
		if len(r.Manifests) == 0 && len(r.Blobs) == 0 && len(r.Tags) == 0 {
			delete(s.idx.Repos, name)
		}
	}
	s.dirty = true
	s.mu.Unlock()
	for _, d := range gone {
		_ = os.Remove(s.path(d))
	}
	return len(gone), freed
}

// flush writes the index if it changed: temporary file, fsync, rename.
func (s *store) flush() error {
	s.mu.Lock()
	if !s.dirty {
		s.mu.Unlock()
		return nil
	}
	b, err := json.Marshal(&s.idx)
	s.dirty = false
	s.mu.Unlock()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.root, ".index-*")
	if err != nil {
		s.markDirty()
		return err
	}
	_, werr := tmp.Write(b)
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), s.indexPath())
	}
	if werr != nil {
		_ = os.Remove(tmp.Name())
		s.markDirty()
	}
	return werr
}

func (s *store) markDirty() {
	s.mu.Lock()
	s.dirty = true
	s.mu.Unlock()
}
