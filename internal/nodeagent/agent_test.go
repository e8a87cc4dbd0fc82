package nodeagent

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

const (
	hubFile      = "/etc/containerd/certs.d/docker.io/hosts.toml"
	testEndpoint = "http://10.96.0.12:5000"
	testUpstream = "https://registry-1.docker.io"
)

// newAgent is an agent of mirror "hub" for docker.io over root, without an API server unless
// kube is given.
func newAgent(t *testing.T, root string, kube *Kube) *Agent {
	t.Helper()
	return newAgentOf(t, root, kube, "hub", "docker.io")
}

func newAgentOf(t *testing.T, root string, kube *Kube, name, host string) *Agent {
	t.Helper()
	a, err := New(Config{Mirror: name, MirrorHost: host, Endpoint: testEndpoint, Upstream: testUpstream,
		Root: root, Kube: kube, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func wantContent(name string) []byte {
	return mirror.HostsTOML(mirror.HostsParams{Mirror: name, Endpoint: testEndpoint, Upstream: testUpstream})
}

func readNode(t *testing.T, root, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantStatus(t *testing.T, st Status, configured bool, reason, hostsDir string) {
	t.Helper()
	if st.Configured != configured || st.Reason != reason || st.HostsDir != hostsDir {
		t.Fatalf("status %+v, want configured=%v reason=%s hostsDir=%q", st, configured, reason, hostsDir)
	}
}

func TestWritesTheFile(t *testing.T) {
	root := writeNode(t, nil)
	a := newAgent(t, root, nil)
	st := a.Sync(context.Background())
	wantStatus(t, st, true, ReasonConfigured, "/etc/containerd/certs.d")
	if got := readNode(t, root, hubFile); got != string(wantContent("hub")) {
		t.Errorf("hosts.toml:\n%s\nwant:\n%s", got, wantContent("hub"))
	}
	fi, err := os.Stat(filepath.Join(root, hubFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644 (containerd runs as root, but the file is no secret)", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(filepath.Join(root, hubFile)))
	if len(entries) != 1 {
		t.Errorf("the host directory holds %d entries, want hosts.toml alone (no temporary file left)", len(entries))
	}
}

// A check of a node that is already right writes nothing: same inode, same modification time.
func TestSteadyStateWritesNothing(t *testing.T) {
	root := writeNode(t, nil)
	a := newAgent(t, root, nil)
	a.Sync(context.Background())
	before := statT(t, filepath.Join(root, hubFile))
	for range 3 {
		wantStatus(t, a.Sync(context.Background()), true, ReasonConfigured, "/etc/containerd/certs.d")
	}
	after := statT(t, filepath.Join(root, hubFile))
	if before.Ino != after.Ino || before.Mtim != after.Mtim {
		t.Errorf("the file was rewritten: inode %d→%d, mtime %v→%v", before.Ino, after.Ino, before.Mtim, after.Mtim)
	}
}

func statT(t *testing.T, path string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestRestoresItsFile(t *testing.T) {
	root := writeNode(t, nil)
	a := newAgent(t, root, nil)
	a.Sync(context.Background())
	path := filepath.Join(root, hubFile)

	if err := os.RemoveAll(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, a.Sync(context.Background()), true, ReasonConfigured, "/etc/containerd/certs.d")
	if got := readNode(t, root, hubFile); got != string(wantContent("hub")) {
		t.Errorf("after deletion, hosts.toml is:\n%s", got)
	}

	// An edit that keeps the marker is an edit of the agent's file: overwritten.
	edited := strings.Replace(string(wantContent("hub")), testEndpoint, "http://10.0.0.1:5000", 1)
	if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, a.Sync(context.Background()), true, ReasonConfigured, "/etc/containerd/certs.d")
	if got := readNode(t, root, hubFile); got != string(wantContent("hub")) {
		t.Errorf("after an edit, hosts.toml is:\n%s", got)
	}
}

func TestLeavesAForeignFileAlone(t *testing.T) {
	foreign := "server = \"https://registry-1.docker.io\"\n[host.\"https://mirror.example\"]\n  capabilities = [\"pull\"]\n"
	root := writeNode(t, map[string]string{hubFile: foreign})
	a := newAgent(t, root, nil)
	st := a.Sync(context.Background())
	wantStatus(t, st, false, ReasonConflict, "/etc/containerd/certs.d")
	if !strings.Contains(st.Message, hubFile) || !strings.Contains(st.Message, "not written by quartermaster") {
		t.Errorf("message %q does not say which file is in the way", st.Message)
	}
	if got := readNode(t, root, hubFile); got != foreign {
		t.Errorf("the foreign file was changed:\n%s", got)
	}
	// Not at shutdown either, even if the mirror were gone.
	if err := a.remove(); err != nil {
		t.Fatal(err)
	}
	if got := readNode(t, root, hubFile); got != foreign {
		t.Errorf("the foreign file was removed or changed:\n%s", got)
	}
}

// Another mirror's file is not ours while the agent cannot tell that mirror is gone.
func TestLeavesAnotherMirrorsFileAlone(t *testing.T) {
	other := string(wantContent("other"))
	root := writeNode(t, map[string]string{hubFile: other})
	st := newAgent(t, root, nil).Sync(context.Background())
	wantStatus(t, st, false, ReasonConflict, "/etc/containerd/certs.d")
	if !strings.Contains(st.Message, "RegistryMirror other") {
		t.Errorf("message %q does not name the other mirror", st.Message)
	}
	if got := readNode(t, root, hubFile); got != other {
		t.Errorf("the other mirror's file was changed:\n%s", got)
	}
}

// The mirror's files under other hosts (an earlier mirrorHost) go at a sync; files of other
// mirrors, foreign files, other files in the directory and symlinked directories stay.
func TestRemovesItsFilesOfOtherHosts(t *testing.T) {
	certs := "/etc/containerd/certs.d/"
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "hosts.toml"), wantContent("hub"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := writeNode(t, map[string]string{
		certs + "quay.io/hosts.toml":                string(wantContent("hub")),
		certs + "registry.internal:5000/hosts.toml": string(wantContent("hub")),
		certs + "registry.internal:5000/ca.crt":     "x",
		certs + "ghcr.io/hosts.toml":                string(wantContent("hub2")),
		certs + "gcr.io/hosts.toml":                 "server = \"https://gcr.io\"\n",
	})
	if err := os.Symlink(outside, filepath.Join(root, certs, "mirror.gcr.io")); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, newAgent(t, root, nil).Sync(context.Background()), true, ReasonConfigured, "/etc/containerd/certs.d")

	if _, err := os.Stat(filepath.Join(root, certs, "quay.io")); !os.IsNotExist(err) {
		t.Errorf("quay.io's directory, which held only the mirror's file, is still there (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(root, certs, "registry.internal:5000/hosts.toml")); !os.IsNotExist(err) {
		t.Errorf("the mirror's file under registry.internal:5000 is still there (%v)", err)
	}
	if got := readNode(t, root, certs+"registry.internal:5000/ca.crt"); got != "x" {
		t.Errorf("ca.crt changed: %q", got)
	}
	if got := readNode(t, root, certs+"ghcr.io/hosts.toml"); got != string(wantContent("hub2")) {
		t.Errorf("another mirror's file was changed:\n%s", got)
	}
	if got := readNode(t, root, certs+"gcr.io/hosts.toml"); got != "server = \"https://gcr.io\"\n" {
		t.Errorf("a foreign file was changed:\n%s", got)
	}
	if _, err := os.Stat(filepath.Join(outside, "hosts.toml")); err != nil {
		t.Errorf("the file behind a symlinked directory was removed: %v", err)
	}
	if got := readNode(t, root, hubFile); got != string(wantContent("hub")) {
		t.Errorf("the mirror's own file is:\n%s", got)
	}
}

// containerd reads registry.internal_5000_ before registry.internal:5000.
func TestShadowingDirectoryIsAConflict(t *testing.T) {
	root := writeNode(t, map[string]string{"/etc/containerd/certs.d/registry.internal_5000_/ca.crt": "x"})
	st := newAgentOf(t, root, nil, "internal", "registry.internal:5000").Sync(context.Background())
	wantStatus(t, st, false, ReasonConflict, "/etc/containerd/certs.d")
	if _, err := os.Stat(filepath.Join(root, "/etc/containerd/certs.d/registry.internal:5000")); !os.IsNotExist(err) {
		t.Errorf("the agent wrote a file containerd would not read (%v)", err)
	}
}

// config_path elsewhere than the mounted directory: the agent says so and writes nothing into
// its own container.
func TestHostsDirNotMounted(t *testing.T) {
	root := writeNodeFiles(t, map[string]string{configFile: "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '/etc/docker/certs.d'\n"})
	st := newAgent(t, root, nil).Sync(context.Background())
	wantStatus(t, st, false, ReasonHostsDirNotMounted, "/etc/docker/certs.d")
	if _, err := os.Stat(filepath.Join(root, "etc", "docker")); !os.IsNotExist(err) {
		t.Errorf("the agent created /etc/docker (%v)", err)
	}
}

// containerd 1 without config_path reads no hosts.toml: nothing is written, and the agent writes
// once the configuration has config_path (a check re-reads it).
func TestConfigPathUnsetThenSet(t *testing.T) {
	root := writeNodeFiles(t, map[string]string{configFile: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause\"\n"})
	a := newAgent(t, root, nil)
	st := a.Sync(context.Background())
	wantStatus(t, st, false, ReasonConfigPathUnset, "")
	if !strings.Contains(st.Message, `[plugins."io.containerd.grpc.v1.cri".registry]`) {
		t.Errorf("message %q does not say where config_path goes", st.Message)
	}
	if _, err := os.Stat(filepath.Join(root, "etc", "containerd", "certs.d")); !os.IsNotExist(err) {
		t.Errorf("the agent wrote into a directory containerd does not read (%v)", err)
	}

	if err := os.WriteFile(filepath.Join(root, configFile), []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, a.Sync(context.Background()), true, ReasonConfigured, "/etc/containerd/certs.d")
	readNode(t, root, hubFile)
}

// containerd 2's CRI pulls through the transfer service, which takes config_path as one
// directory: with its default list the node is not configured, the file is written all the same
// (containerd reads it once config_path is fixed), and the message says what to set.
func TestConfigPathListIsIgnoredByContainerd2(t *testing.T) {
	for name, tc := range map[string]struct {
		config string // "" = no file
		want   []string
	}{
		"no config file":               {want: []string{`config_path is unset, so it is containerd 2's default "/etc/containerd/certs.d:/etc/docker/certs.d"`}},
		"version 3, no registry table": {config: "version = 3\n", want: []string{"containerd 2's default"}},
		"version 3, a list": {
			config: "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '/etc/containerd/certs.d:/etc/containerd/more.d'\n",
			want:   []string{`config_path is "/etc/containerd/certs.d:/etc/containerd/more.d"`},
		},
	} {
		t.Run(name, func(t *testing.T) {
			files := map[string]string{}
			if tc.config != "" {
				files[configFile] = tc.config
			}
			root := writeNodeFiles(t, files)
			a := newAgent(t, root, nil)
			st := a.Sync(context.Background())
			wantStatus(t, st, false, ReasonConfigPathIgnored, "/etc/containerd/certs.d")
			for _, w := range append(tc.want,
				"reads config_path as one directory", "pulls ignore /etc/containerd/certs.d/docker.io/hosts.toml",
				`in /etc/containerd/config.toml set config_path = "/etc/containerd/certs.d" under [plugins."io.containerd.cri.v1.images".registry]`,
				`use_local_image_pull = true under [plugins."io.containerd.cri.v1.images"]`, "restart containerd") {
				if !strings.Contains(st.Message, w) {
					t.Errorf("message %q does not say %q", st.Message, w)
				}
			}
			if got := readNode(t, root, hubFile); got != string(wantContent("hub")) {
				t.Errorf("hosts.toml:\n%s", got)
			}
			if a.Status().Configured {
				t.Error("the readiness status says configured")
			}
		})
	}
}

// With use_local_image_pull containerd 2 pulls as containerd 1 did, reading each directory of the
// list: the first one configures the node.
func TestLocalPullReadsTheList(t *testing.T) {
	root := writeNodeFiles(t, map[string]string{configFile: "version = 3\n[plugins.'io.containerd.cri.v1.images']\n  use_local_image_pull = true\n"})
	wantStatus(t, newAgent(t, root, nil).Sync(context.Background()), true, ReasonConfigured, "/etc/containerd/certs.d")
	readNode(t, root, hubFile)
}

func TestUnreadableContainerdConfig(t *testing.T) {
	root := writeNodeFiles(t, map[string]string{configFile: "version = = 3"})
	wantStatus(t, newAgent(t, root, nil).Sync(context.Background()), false, ReasonConfigUnreadable, "")
}

func TestProbes(t *testing.T) {
	root := writeNode(t, nil)
	a := newAgent(t, root, nil)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d before the first check, want 200", code)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, ReasonStarting) {
		t.Errorf("/readyz = %d %q before the first check, want 503 %s", code, body, ReasonStarting)
	}
	a.Sync(context.Background())
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d once configured, want 200", code)
	}
	if err := os.WriteFile(filepath.Join(root, hubFile), []byte("server = \"https://x\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.Sync(context.Background())
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, ReasonConflict) {
		t.Errorf("/readyz = %d %q with a foreign file, want 503 %s", code, body, ReasonConflict)
	}
}

func TestConfigIsChecked(t *testing.T) {
	ok := Config{Mirror: "hub", MirrorHost: "docker.io", Endpoint: testEndpoint, Upstream: testUpstream, Root: "/host"}
	for name, tweak := range map[string]func(*Config){
		"no mirror":             func(c *Config) { c.Mirror = "" },
		"mirror host with path": func(c *Config) { c.MirrorHost = "../etc" },
		"mirror host empty":     func(c *Config) { c.MirrorHost = "" },
		"endpoint not a URL":    func(c *Config) { c.Endpoint = "10.96.0.12:5000" },
		"upstream with a path":  func(c *Config) { c.Upstream = "https://quay.io/v2" },
		"no root":               func(c *Config) { c.Root = "" },
	} {
		c := ok
		tweak(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: New accepted %+v", name, c)
		}
	}
	if _, err := New(ok); err != nil {
		t.Errorf("New refused a good config: %v", err)
	}
}
