package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testEpoch stands for SOURCE_DATE_EPOCH: every time in the image must be this one.
const testEpoch = 1700000000

// TestImageReproducibleAndPushed builds the image twice, each time from scratch (go build of both
// platforms, layers, layout, tarball), as `make image` does but through the program built once
// without the race detector (gzipping two ~75 MB binaries would be slow under it); then pushes
// it to a distribution registry on loopback and checks, through the registry API only, what a
// node would pull.
func TestImageReproducibleAndPushed(t *testing.T) {
	// No deadline of its own: two builds of two platforms take what the machine gives them
	// (minutes when other packages build beside it); go test's -timeout bounds the test.
	ctx := t.Context()
	tmp := t.TempDir()
	program := filepath.Join(tmp, "image")
	if err := testenv.GoBuild(program, "./hack/image"); err != nil {
		t.Fatal(err)
	}
	runProgram := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, program, args...)
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.Itoa(testEpoch), "DOCKER_CONFIG="+tmp)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("image %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	// Two builds, same digest, same bytes.
	var digests []string
	for _, out := range []string{"a", "b"} {
		start := time.Now()
		t.Log(strings.TrimSpace(runProgram("build", "--out", filepath.Join(tmp, out), "--tag", "test")))
		t.Logf("build %s took %s", out, time.Since(start).Round(100*time.Millisecond))
		d, err := os.ReadFile(filepath.Join(tmp, out, "digest"))
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, strings.TrimSpace(string(d)))
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds gave two image index digests: %s and %s", digests[0], digests[1])
	}
	index := digest.Digest(digests[0])
	if err := index.Validate(); err != nil {
		t.Fatalf("digest file: %v", err)
	}
	if a, b := fileHash(t, filepath.Join(tmp, "a", "quartermaster.oci.tar")), fileHash(t, filepath.Join(tmp, "b", "quartermaster.oci.tar")); a != b {
		t.Fatalf("the OCI tarballs differ: %s and %s", a, b)
	}
	checkLayoutNames(t, filepath.Join(tmp, "a", "oci"), index, "test")

	// Pushed to a registry, read back through its API.
	reg := startRegistry(t)
	start := time.Now()
	out := runProgram("push", "--layout", filepath.Join(tmp, "a", "oci"), reg.host+"/team/quartermaster:v1")
	if want := "pushed " + reg.host + "/team/quartermaster:v1@" + index.String(); !strings.Contains(out, want) {
		t.Fatalf("push printed %q, want %q", out, want)
	}
	t.Logf("push took %s", time.Since(start).Round(100*time.Millisecond))
	raw := reg.manifest(t, "team/quartermaster", "v1", ocispec.MediaTypeImageIndex, index)
	var idx ocispec.Index
	mustUnmarshal(t, raw, &idx)
	if idx.MediaType != ocispec.MediaTypeImageIndex {
		t.Errorf("index media type %q", idx.MediaType)
	}
	if got, want := idx.Annotations[ocispec.AnnotationCreated], time.Unix(testEpoch, 0).UTC().Format(time.RFC3339); got != want {
		t.Errorf("index created %q, want %q", got, want)
	}
	var arches []string
	var bases []digest.Digest
	for _, m := range idx.Manifests {
		if m.Platform == nil || m.Platform.OS != "linux" {
			t.Fatalf("manifest %s: platform %+v, want linux", m.Digest, m.Platform)
		}
		arch := m.Platform.Architecture
		arches = append(arches, arch)
		t.Run(arch, func(t *testing.T) {
			bases = append(bases, checkPlatformImage(t, reg, m, arch))
		})
	}
	if !slices.Equal(arches, []string{"amd64", "arm64"}) {
		t.Fatalf("index platforms linux/%v, want linux/[amd64 arm64]", arches)
	}
	if len(bases) == 2 && bases[0] != bases[1] {
		t.Errorf("the base layers differ between platforms: %s, %s", bases[0], bases[1])
	}
	checkBaseLayer(t, reg.blob(t, "team/quartermaster", bases[0]))
}

// checkPlatformImage checks one platform's manifest, config and binary layer, and returns the
// base layer's digest.
func checkPlatformImage(t *testing.T, reg registry, desc ocispec.Descriptor, arch string) digest.Digest {
	const repo = "team/quartermaster"
	var m ocispec.Manifest
	mustUnmarshal(t, reg.manifest(t, repo, desc.Digest.String(), ocispec.MediaTypeImageManifest, desc.Digest), &m)
	if m.MediaType != ocispec.MediaTypeImageManifest || m.Config.MediaType != ocispec.MediaTypeImageConfig {
		t.Errorf("media types: manifest %q, config %q", m.MediaType, m.Config.MediaType)
	}
	if len(m.Layers) != 2 {
		t.Fatalf("%d layers, want 2 (base, binary)", len(m.Layers))
	}
	for _, l := range m.Layers {
		if l.MediaType != ocispec.MediaTypeImageLayerGzip {
			t.Errorf("layer %s: media type %q", l.Digest, l.MediaType)
		}
	}

	var cfg ocispec.Image
	mustUnmarshal(t, reg.blob(t, repo, m.Config.Digest), &cfg)
	if cfg.OS != "linux" || cfg.Architecture != arch {
		t.Errorf("config platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, arch)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cfg.Config.User)
	}
	// Exec form, no shell: /quartermaster is the process.
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/quartermaster"}) || len(cfg.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [/quartermaster] and none", cfg.Config.Entrypoint, cfg.Config.Cmd)
	}
	if !slices.Contains(cfg.Config.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") || cfg.Config.WorkingDir != "/home/nonroot" {
		t.Errorf("env %q, working dir %q", cfg.Config.Env, cfg.Config.WorkingDir)
	}
	if cfg.Created == nil || !cfg.Created.Equal(time.Unix(testEpoch, 0)) {
		t.Errorf("created %v, want %v", cfg.Created, time.Unix(testEpoch, 0).UTC())
	}
	if len(cfg.RootFS.DiffIDs) != 2 {
		t.Errorf("%d diff IDs", len(cfg.RootFS.DiffIDs))
	}

	entries := readLayer(t, reg.blob(t, repo, m.Layers[1].Digest))
	if len(entries) != 1 {
		t.Fatalf("binary layer holds %v, want quartermaster alone", names(entries))
	}
	bin := entries[0]
	checkHeader(t, bin.hdr, "quartermaster", tar.TypeReg, 0o755, 0)
	f, err := elf.NewFile(bytes.NewReader(bin.data))
	if err != nil {
		t.Fatalf("quartermaster is not an ELF file: %v", err)
	}
	if want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]; f.Machine != want {
		t.Errorf("ELF machine %s, want %s", f.Machine, want)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("quartermaster is dynamically linked (program header %s)", p.Type)
		}
	}
	if f.Section(".symtab") != nil {
		t.Error("quartermaster has a symbol table: not built with -s")
	}
	if arch == runtime.GOARCH {
		// The binary runs here (and alone: static, nothing but itself).
		exe := filepath.Join(t.TempDir(), "quartermaster")
		if err := os.WriteFile(exe, bin.data, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(exe, "--help").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "-controllers") {
			t.Errorf("quartermaster --help: %v\n%s", err, out)
		}
	}
	return m.Layers[0].Digest
}

// checkBaseLayer checks every entry of the base layer: exactly distroless's users, groups and
// folders, Debian's CA certificates, nothing else (no shell).
func checkBaseLayer(t *testing.T, blob []byte) {
	entries := readLayer(t, blob)
	want := []string{
		"etc/", "etc/group", "etc/nsswitch.conf", "etc/passwd", "etc/ssl/", "etc/ssl/certs/",
		"etc/ssl/certs/ca-certificates.crt", "home/", "home/nonroot/", "root/", "tmp/",
	}
	if got := names(entries); !slices.Equal(got, want) {
		t.Fatalf("base layer entries %q, want %q", got, want)
	}
	files := map[string]string{}
	for _, e := range entries {
		files[e.hdr.Name] = string(e.data)
		switch e.hdr.Name {
		case "home/nonroot/":
			checkHeader(t, e.hdr, e.hdr.Name, tar.TypeDir, 0o700, nonRoot)
		case "root/":
			checkHeader(t, e.hdr, e.hdr.Name, tar.TypeDir, 0o700, 0)
		case "tmp/":
			checkHeader(t, e.hdr, e.hdr.Name, tar.TypeDir, 0o1777, 0)
		default:
			if strings.HasSuffix(e.hdr.Name, "/") {
				checkHeader(t, e.hdr, e.hdr.Name, tar.TypeDir, 0o755, 0)
			} else {
				checkHeader(t, e.hdr, e.hdr.Name, tar.TypeReg, 0o644, 0)
			}
		}
	}
	if !strings.Contains(files["etc/passwd"], "\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n") ||
		!strings.Contains(files["etc/group"], "\nnonroot:x:65532:\n") {
		t.Errorf("no nonroot 65532 in\n%s\n%s", files["etc/passwd"], files["etc/group"])
	}

	// Every certificate of Debian's package, and nothing else (the build machine's own CAs stay out).
	pkgCerts, err := filepath.Glob("/usr/share/ca-certificates/mozilla/*.crt")
	if err != nil || len(pkgCerts) == 0 {
		t.Fatalf("Debian's ca-certificates is not installed here: %v", err)
	}
	rest := []byte(files["etc/ssl/certs/ca-certificates.crt"])
	n := 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			t.Errorf("certificate %d: %v", n, err)
		}
		n++
	}
	if n != len(pkgCerts) || len(bytes.TrimSpace(rest)) != 0 {
		t.Errorf("the bundle holds %d certificates (and %d bytes after them), Debian's package %d", n, len(rest), len(pkgCerts))
	}
}

// checkHeader checks an entry's type, mode and owner, and what makes it reproducible: the one
// modification time, numeric owners, no access or change time.
func checkHeader(t *testing.T, h *tar.Header, name string, typ byte, mode int64, owner int) {
	t.Helper()
	if h.Name != name || h.Typeflag != typ || h.Mode&0o7777 != mode || h.Uid != owner || h.Gid != owner {
		t.Errorf("%s: type %c mode %#o owner %d:%d, want %s type %c mode %#o owner %d:%d",
			h.Name, h.Typeflag, h.Mode&0o7777, h.Uid, h.Gid, name, typ, mode, owner, owner)
	}
	if h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(time.Unix(testEpoch, 0)) ||
		!h.AccessTime.IsZero() || !h.ChangeTime.IsZero() || len(h.PAXRecords) != 0 {
		t.Errorf("%s: owner names %q:%q, mtime %v atime %v ctime %v, PAX %v: want numeric owners, mtime %d only",
			h.Name, h.Uname, h.Gname, h.ModTime, h.AccessTime, h.ChangeTime, h.PAXRecords, testEpoch)
	}
}

type layerEntry struct {
	hdr  *tar.Header
	data []byte
}

func readLayer(t *testing.T, blob []byte) []layerEntry {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out []layerEntry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, layerEntry{hdr: h, data: data})
	}
}

func names(entries []layerEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.hdr.Name)
	}
	return out
}

// checkLayoutNames checks the layout's index.json: one image index, tagged.
func checkLayoutNames(t *testing.T, dir string, index digest.Digest, tag string) {
	raw, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var top ocispec.Index
	mustUnmarshal(t, raw, &top)
	if len(top.Manifests) != 1 || top.Manifests[0].Digest != index ||
		top.Manifests[0].MediaType != ocispec.MediaTypeImageIndex || top.Manifests[0].Annotations[ocispec.AnnotationRefName] != tag {
		t.Fatalf("%s/index.json: %s, want the image index %s named %s", dir, raw, index, tag)
	}
	blob, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", index.Encoded()))
	if err != nil || digest.FromBytes(blob) != index {
		t.Fatalf("the layout's index blob: %v", err)
	}
}

func fileHash(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func mustUnmarshal(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%v in %s", err, data)
	}
}

// registry is a distribution registry (in memory) served on loopback.
type registry struct{ host string }

func startRegistry(t *testing.T) registry {
	t.Helper()
	// On disk: the in-memory driver takes half a minute to take 45 MB under the race detector.
	cfg := &configuration.Configuration{Storage: configuration.Storage{
		"filesystem": configuration.Parameters{"rootdirectory": t.TempDir()},
	}}
	cfg.HTTP.Secret = "image-test-upload-secret"
	// distribution logs every request (and a 404 for every blob the push checks) through logrus's
	// standard logger.
	out := logrus.StandardLogger().Out
	logrus.SetOutput(io.Discard)
	t.Cleanup(func() { logrus.SetOutput(out) })
	app := handlers.NewApp(context.Background(), cfg)
	t.Cleanup(func() { _ = app.Shutdown() })
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	return registry{host: srv.Listener.Addr().String()}
}

// get fetches a registry API path and checks the content is the digest asked for.
func (r registry) get(t *testing.T, path, accept string, want digest.Digest) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+r.host+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %s", path, resp.Status, body)
	}
	if got := digest.FromBytes(body); got != want {
		t.Fatalf("GET %s: content %s, want %s", path, got, want)
	}
	return body
}

func (r registry) manifest(t *testing.T, repo, ref, mediaType string, want digest.Digest) []byte {
	t.Helper()
	return r.get(t, "/v2/"+repo+"/manifests/"+ref, mediaType, want)
}

func (r registry) blob(t *testing.T, repo string, d digest.Digest) []byte {
	t.Helper()
	return r.get(t, "/v2/"+repo+"/blobs/"+d.String(), "", d)
}
