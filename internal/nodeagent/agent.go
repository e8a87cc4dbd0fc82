// Package nodeagent is the registry mirror's node agent: on one node, it points containerd at
// one RegistryMirror by keeping the mirror's hosts.toml in the hosts directory containerd reads,
// reports how the node is configured, and removes the file when the mirror no longer serves the
// host (deleted, refused for it, or moved).
package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// DefaultResync is how often the agent checks the file and containerd's configuration again.
const DefaultResync = 30 * time.Second

// shutdownTimeout bounds the last read of the RegistryMirror and the removal at shutdown: well
// inside the Pod's termination grace period.
const shutdownTimeout = 10 * time.Second

// apiTimeout bounds each request to the API server, so that one slow request does not hold back
// the next check of the file.
const apiTimeout = 10 * time.Second

// Config is one agent's mirror and node.
type Config struct {
	// Mirror is the RegistryMirror's name.
	Mirror string
	// MirrorHost is the registry host whose pulls go to the mirror (a certs.d directory name).
	MirrorHost string
	// Endpoint is the mirror's address, e.g. http://10.96.0.12:5000.
	Endpoint string
	// Upstream is the upstream registry's root: containerd's fallback.
	Upstream string
	// Root is where the agent sees the node's filesystem (the host mount, /host in the Pod).
	Root string
	// ContainerdConfig is containerd's configuration file as a node path; default
	// DefaultContainerdConfig.
	ContainerdConfig string
	// Resync is the interval between checks; default DefaultResync.
	Resync time.Duration
	// Kube is the API server; nil (in tests of the files alone) reports nothing and keeps the
	// file at shutdown.
	Kube *Kube
	Log  logr.Logger
}

// Reasons for a node's state (AnnotationReason).
const (
	ReasonConfigured = "Configured"
	// ReasonConfigPathUnset: containerd reads no hosts.toml (containerd 1 without config_path).
	ReasonConfigPathUnset = "ConfigPathUnset"
	// ReasonConfigPathIgnored: containerd 2 reads config_path as one directory (its CRI pulls go
	// through the transfer service) and it is a list, containerd 2's default included: pulls
	// ignore every hosts.toml. The agent writes its file all the same, for when that is fixed.
	ReasonConfigPathIgnored = "ConfigPathIgnored"
	// ReasonConfigUnreadable: containerd's configuration could not be read or parsed.
	ReasonConfigUnreadable = "ContainerdConfigUnreadable"
	// ReasonConflict: a hosts.toml the agent did not write is in the way; it is left alone.
	ReasonConflict = "Conflict"
	// ReasonHostsDirNotMounted: containerd's hosts directory is outside what the agent sees.
	ReasonHostsDirNotMounted = "HostsDirNotMounted"
	// ReasonWriteFailed: the file could not be written.
	ReasonWriteFailed = "WriteFailed"
	// ReasonStarting: no check has finished yet.
	ReasonStarting = "Starting"
)

// Status is how the node is configured for the mirror, as of the last check.
type Status struct {
	// HostsDir is the node directory containerd reads hosts.toml from first, or "".
	HostsDir string
	// Configured: the file is in place with the current content and containerd reads HostsDir.
	Configured bool
	Reason     string
	Message    string
}

// Annotations are the Pod annotations that report s.
func (s Status) Annotations() map[string]string {
	return map[string]string{
		AnnotationHostsDir:   s.HostsDir,
		AnnotationConfigured: fmt.Sprint(s.Configured),
		AnnotationReason:     s.Reason,
		AnnotationMessage:    s.Message,
	}
}

// Agent keeps one mirror's hosts.toml on one node. Sync and Shutdown run on one goroutine; the
// probes read the status from any.
type Agent struct {
	cfg     Config
	content []byte
	log     logr.Logger

	status       atomic.Pointer[Status]
	lastProgress atomic.Int64 // unix nanoseconds of the last finished check, for liveness
	reported     map[string]string
}

// New checks cfg and returns its agent.
func New(cfg Config) (*Agent, error) {
	if cfg.Mirror == "" {
		return nil, errors.New("the RegistryMirror's name is required")
	}
	if err := mirror.ValidateMirrorHost(cfg.MirrorHost); err != nil {
		return nil, err
	}
	if u, err := url.Parse(cfg.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("endpoint %q is not an http:// or https:// address", cfg.Endpoint)
	}
	upstream, err := mirror.NormalizeUpstream(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	if cfg.Root == "" {
		return nil, errors.New("the node's root mount is required")
	}
	if cfg.ContainerdConfig == "" {
		cfg.ContainerdConfig = DefaultContainerdConfig
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	a := &Agent{
		cfg:     cfg,
		content: mirror.HostsTOML(mirror.HostsParams{Mirror: cfg.Mirror, Endpoint: cfg.Endpoint, Upstream: upstream}),
		log:     cfg.Log.WithValues("mirror", cfg.Mirror, "mirrorHost", cfg.MirrorHost),
	}
	a.status.Store(&Status{Reason: ReasonStarting, Message: "the first check has not finished"})
	a.lastProgress.Store(time.Now().UnixNano())
	return a, nil
}

// Status is the outcome of the last check.
func (a *Agent) Status() Status { return *a.status.Load() }

// Sync checks containerd's configuration and the file once, writes the file if it is missing or
// not the current one (and is the agent's to write), and reports the outcome on the Pod when it
// changed.
func (a *Agent) Sync(ctx context.Context) Status {
	st := a.check(ctx)
	if prev := a.Status(); prev.Reason != st.Reason || prev.Message != st.Message {
		a.log.Info("node state", "configured", st.Configured, "reason", st.Reason, "message", st.Message)
	}
	a.status.Store(&st)
	a.lastProgress.Store(time.Now().UnixNano())
	a.report(ctx, st)
	return st
}

// target is where the mirror's file goes on this node.
type target struct {
	hc       HostsConfig
	hostsDir string // containerd's directory, a node path
	dir      string // the mirror host's directory, as the agent sees it
	file     string // its hosts.toml, as the agent sees it
	shadow   string // the host_port_ directory containerd would read instead, if any
}

// locate reads containerd's configuration and says where the file goes; a Status when it goes
// nowhere.
func (a *Agent) locate() (target, *Status) {
	hc, err := ReadHostsConfig(a.cfg.Root, a.cfg.ContainerdConfig)
	if err != nil {
		return target{}, &Status{Reason: ReasonConfigUnreadable, Message: err.Error()}
	}
	hostsDir := hc.Dir()
	if hostsDir == "" {
		return target{}, &Status{Reason: ReasonConfigPathUnset, Message: configPathUnsetMessage(hc)}
	}
	t := target{
		hc:       hc,
		hostsDir: hostsDir,
		dir:      nodePath(a.cfg.Root, filepath.Join(hostsDir, a.cfg.MirrorHost)),
	}
	t.file = filepath.Join(t.dir, "hosts.toml")
	if s := mirror.ShadowingHostDirName(a.cfg.MirrorHost); s != "" {
		t.shadow = nodePath(a.cfg.Root, filepath.Join(hostsDir, s))
	}
	return t, nil
}

func configPathUnsetMessage(hc HostsConfig) string {
	table := `[plugins."io.containerd.grpc.v1.cri".registry]`
	if hc.Version <= 1 {
		table = "[plugins.cri.registry]"
	}
	return fmt.Sprintf("containerd's configuration (version %d, containerd 1.x) sets no config_path in %s, so containerd reads no hosts.toml: "+
		`set config_path = "/etc/containerd/certs.d" there and restart containerd`, hc.Version, table)
}

// check is writeFile's outcome, unless containerd ignores the directory the file is in: then the
// node is not configured whatever the file says.
func (a *Agent) check(ctx context.Context) Status {
	t, st := a.locate()
	if st != nil {
		return *st
	}
	out := a.writeFile(ctx, t)
	if out.Configured && t.hc.Ignored() {
		return Status{HostsDir: t.hostsDir, Reason: ReasonConfigPathIgnored, Message: configPathIgnoredMessage(a.cfg, t)}
	}
	return out
}

func configPathIgnoredMessage(cfg Config, t target) string {
	what := fmt.Sprintf("config_path is %q", t.hc.ConfigPath)
	if t.hc.Defaulted {
		what = fmt.Sprintf("config_path is unset, so it is containerd 2's default %q", t.hc.ConfigPath)
	}
	return fmt.Sprintf("containerd 2 pulls images for the kubelet through its transfer service, which reads config_path as one directory; "+
		"%s, so pulls ignore %s: in %s set config_path = %q under [plugins.\"%s\".registry] "+
		"(or use_local_image_pull = true under [plugins.\"%s\"]) and restart containerd",
		what, filepath.Join(t.hostsDir, cfg.MirrorHost, "hosts.toml"), cfg.ContainerdConfig, t.hostsDir, imagesPlugin, imagesPlugin)
}

// writeFile keeps the mirror's file in t, and says whether it is in place.
func (a *Agent) writeFile(ctx context.Context, t target) Status {
	a.removeStale(t)
	failed := func(reason, format string, args ...any) Status {
		return Status{HostsDir: t.hostsDir, Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	if t.shadow != "" {
		if _, err := os.Lstat(t.shadow); err == nil {
			return failed(ReasonConflict, "%s exists and containerd reads it instead of %s; left alone",
				filepath.Join(t.hostsDir, filepath.Base(t.shadow)), filepath.Join(t.hostsDir, a.cfg.MirrorHost))
		}
	}
	nodeFile := filepath.Join(t.hostsDir, a.cfg.MirrorHost, "hosts.toml")
	current, err := os.ReadFile(t.file)
	switch {
	case err == nil && bytes.Equal(current, a.content):
		return Status{HostsDir: t.hostsDir, Configured: true, Reason: ReasonConfigured,
			Message: fmt.Sprintf("%s sends pulls of %s to %s", nodeFile, a.cfg.MirrorHost, a.cfg.Endpoint)}
	case err == nil:
		owner, ours := mirror.HostsFileOwner(current)
		if !ours {
			return failed(ReasonConflict, "%s was not written by quartermaster; left alone: remove it to let the mirror configure this node", nodeFile)
		}
		if owner != a.cfg.Mirror && !a.releases(ctx, owner) {
			return failed(ReasonConflict, "%s belongs to RegistryMirror %s, which still serves %s; left alone", nodeFile, owner, a.cfg.MirrorHost)
		}
	case errors.Is(err, fs.ErrNotExist):
	default:
		return failed(ReasonWriteFailed, "reading %s: %v", nodeFile, err)
	}

	if reason, err := a.makeDirs(t); err != nil {
		return failed(reason, "%v", err)
	}
	if err := writeAtomic(t.file, a.content); err != nil {
		return failed(ReasonWriteFailed, "writing %s: %v", nodeFile, err)
	}
	if current == nil {
		a.log.Info("wrote hosts.toml", "path", nodeFile, "endpoint", a.cfg.Endpoint)
	} else {
		a.log.Info("rewrote hosts.toml: its content was not the current one", "path", nodeFile, "endpoint", a.cfg.Endpoint)
	}
	return Status{HostsDir: t.hostsDir, Configured: true, Reason: ReasonConfigured,
		Message: fmt.Sprintf("%s sends pulls of %s to %s", nodeFile, a.cfg.MirrorHost, a.cfg.Endpoint)}
}

// makeDirs creates containerd's hosts directory and the mirror host's directory in it. The hosts
// directory's parent must exist already: a parent missing under Root means the node's directory
// is not mounted, and creating it would write into the container, not the node.
func (a *Agent) makeDirs(t target) (reason string, err error) {
	hostsDir := nodePath(a.cfg.Root, t.hostsDir)
	if _, err := os.Stat(hostsDir); errors.Is(err, fs.ErrNotExist) {
		parent := filepath.Dir(t.hostsDir)
		if _, err := os.Stat(nodePath(a.cfg.Root, parent)); err != nil {
			return ReasonHostsDirNotMounted, fmt.Errorf("containerd reads hosts.toml from %s, but the agent does not see the node's %s: mount it", t.hostsDir, parent)
		}
		if err := os.Mkdir(hostsDir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return ReasonWriteFailed, err
		}
		a.log.Info("created containerd's hosts directory", "path", t.hostsDir)
	}
	if err := os.Mkdir(t.dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return ReasonWriteFailed, err
	}
	return "", nil
}

// releases says whether the named RegistryMirror no longer serves this agent's host (see
// MirrorState), so that its file there is this agent's to take over; false when the agent cannot
// tell.
func (a *Agent) releases(ctx context.Context, name string) bool {
	if a.cfg.Kube == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	state, err := a.cfg.Kube.Mirror(ctx, name, a.cfg.MirrorHost)
	if err != nil {
		a.log.Info("cannot read RegistryMirror", "name", name, "error", err.Error())
		return false
	}
	if state.Releases() {
		a.log.Info("taking over another mirror's hosts.toml", "owner", name, "state", state.String())
	}
	return state.Releases()
}

// report patches the Pod's annotations when they differ from what it last patched.
func (a *Agent) report(ctx context.Context, st Status) {
	if a.cfg.Kube == nil {
		return
	}
	ann := st.Annotations()
	if maps.Equal(ann, a.reported) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if err := a.cfg.Kube.Annotate(ctx, ann); err != nil {
		a.log.Error(err, "annotating the agent's Pod; retrying")
		return
	}
	a.reported = ann
	a.log.Info("annotated the agent's Pod", "configured", st.Configured, "reason", st.Reason, "hostsDir", st.HostsDir)
}

// unreported says whether the Pod's annotations lag the last check: its report failed.
func (a *Agent) unreported() bool {
	return a.cfg.Kube != nil && !maps.Equal(a.Status().Annotations(), a.reported)
}

// Shutdown removes the file when the RegistryMirror no longer serves the host (gone, being
// deleted, refused for the host as a duplicate, or moved to another host), and keeps it
// otherwise: a restart or a rolling update of the agent leaves pulls going through the mirror,
// and when the API server cannot say, a file left behind is safe (containerd falls back to the
// upstream). A file kept for a mirror that no longer serves the host would block the mirror that
// does, whose agents take over only a released host's file.
func (a *Agent) Shutdown(ctx context.Context) {
	if a.cfg.Kube == nil {
		a.log.Info("keeping hosts.toml: no API server to ask whether the RegistryMirror still serves the host")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	state, err := a.cfg.Kube.Mirror(ctx, a.cfg.Mirror, a.cfg.MirrorHost)
	if err != nil {
		a.log.Info("keeping hosts.toml: cannot tell whether the RegistryMirror still serves the host", "error", err.Error())
		return
	}
	if !state.Releases() {
		a.log.Info("keeping hosts.toml: the RegistryMirror serves the host (agent restart or update)")
		return
	}
	a.log.Info("removing hosts.toml", "reason", "the RegistryMirror "+state.String())
	if err := a.remove(); err != nil {
		a.log.Error(err, "removing hosts.toml")
	}
}

// remove deletes the file if it is this mirror's, and the mirror host's directory if that is then
// empty (an empty host directory means nothing to containerd).
func (a *Agent) remove() error {
	t, st := a.locate()
	if st != nil {
		a.log.Info("nothing to remove", "reason", st.Reason, "message", st.Message)
		return nil
	}
	_, err := a.removeOwn(t.hostsDir, a.cfg.MirrorHost)
	return err
}

// removeStale removes this mirror's files from the other host directories of hostsDir: left by
// an earlier mirrorHost of the mirror, they would send that host's pulls to a mirror of another
// upstream. Failures are logged and retried at the next check: they do not change how the node
// is configured for the current host.
func (a *Agent) removeStale(t target) {
	entries, err := os.ReadDir(nodePath(a.cfg.Root, t.hostsDir))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			a.log.Error(err, "listing containerd's hosts directory for files of an earlier mirror host", "path", t.hostsDir)
		}
		return
	}
	for _, e := range entries {
		// A symlinked directory is someone else's arrangement: left alone.
		if !e.IsDir() || e.Name() == a.cfg.MirrorHost {
			continue
		}
		removed, err := a.removeOwn(t.hostsDir, e.Name())
		if err != nil {
			a.log.Error(err, "removing this mirror's hosts.toml from another host's directory", "host", e.Name())
		} else if removed {
			a.log.Info("removed this mirror's hosts.toml from another host's directory (an earlier mirror host)", "host", e.Name())
		}
	}
}

// removeOwn deletes <hostsDir>/<host>/hosts.toml (hostsDir a node path) when it is a regular file
// whose marker names this mirror exactly, then the host's directory if that is empty.
func (a *Agent) removeOwn(hostsDir, host string) (removed bool, err error) {
	dir := nodePath(a.cfg.Root, filepath.Join(hostsDir, host))
	file := filepath.Join(dir, "hosts.toml")
	nodeFile := filepath.Join(hostsDir, host, "hosts.toml")
	fi, err := os.Lstat(file)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !fi.Mode().IsRegular() { // the agent writes regular files only
		return false, nil
	}
	current, err := os.ReadFile(file)
	if err != nil {
		return false, err
	}
	if owner, ours := mirror.HostsFileOwner(current); !ours || owner != a.cfg.Mirror {
		if host == a.cfg.MirrorHost {
			a.log.Info("leaving hosts.toml: not this mirror's", "path", nodeFile)
		}
		return false, nil
	}
	if err := os.Remove(file); err != nil {
		return false, err
	}
	if err := syncDir(dir); err != nil {
		return true, err
	}
	a.log.Info("removed hosts.toml", "path", nodeFile)
	if err := os.Remove(dir); err == nil {
		a.log.Info("removed the mirror host's directory", "path", filepath.Join(hostsDir, host))
		return true, syncDir(filepath.Dir(dir))
	}
	return true, nil
}

// writeAtomic replaces path with data: a temporary file in the same directory, synced, renamed
// over it, and the directory synced, so containerd reads the old file or the new one, never a
// part, and a crash leaves one of them.
func writeAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".quartermaster-hosts.toml.*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
