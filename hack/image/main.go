// Command image builds the manager's OCI image without a Docker engine, and pushes it.
//
//	go run ./hack/image build [--out bin/image] [--platforms linux/amd64,linux/arm64] [--tag dev]
//	go run ./hack/image push [--layout bin/image/oci] [--insecure] REGISTRY/quartermaster:TAG
//
// `make image` and `make image-push` run it through hack/image.sh, which first installs what the
// image takes from the build machine (Debian's ca-certificates package) when it is missing.
//
// build compiles a static ./cmd/quartermaster per platform and makes an OCI image index of one
// image per platform, each of two layers:
//
//   - the base, the same for every platform: /etc/passwd and /etc/group with distroless's users
//     (root 0, nobody 65534, nonroot 65532), /etc/nsswitch.conf, the CA certificates of Debian's
//     ca-certificates package at /etc/ssl/certs/ca-certificates.crt, /home/nonroot (0700, owned by
//     65532), /root (0700) and /tmp (1777);
//   - the binary, /quartermaster, mode 0755.
//
// The config runs /quartermaster as 65532:65532, like the Dockerfile's image (distroless/static:
// nonroot, USER 65532:65532, ENTRYPOINT ["/quartermaster"]): keep the two consistent. There is no
// shell and nothing is written under the root, so the image runs with a read-only root filesystem.
//
// Two builds of the same commit give the same index digest: the binaries are built with
// -trimpath, -buildvcs=false and an empty build ID; GNU tar makes each layer with sorted names,
// one modification time (SOURCE_DATE_EPOCH, else the commit's time, else 0), numeric owners and
// no access or change times; the configs' and history's times are that same instant. The output:
//
//	<out>/oci/                   the OCI image layout: index.json → the image index (tagged --tag)
//	<out>/quartermaster.oci.tar  the same layout as one tarball (an OCI archive: skopeo oci-archive:…)
//	<out>/digest                 the image index's digest
//
// push reads the layout and pushes the image index (its manifests, configs and layers) to a
// registry, with the credentials of the Docker config (~/.docker/config.json and its helpers).
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"
)

const (
	// nonRoot is distroless's nonroot user and group.
	nonRoot = 65532
	// user and entrypoint are the Dockerfile's USER and ENTRYPOINT.
	user       = "65532:65532"
	binaryName = "quartermaster"
	entrypoint = "/" + binaryName
	// caBundle is where Go (and distroless) look for the CA certificates.
	caBundle = "/etc/ssl/certs/ca-certificates.crt"
	// debianCerts holds the certificates Debian's ca-certificates package ships. The bundle is made
	// from them alone, in the order update-ca-certificates uses, and not copied from the build
	// machine's /etc/ssl/certs: that one also holds the machine's own local CAs.
	debianCerts = "/usr/share/ca-certificates/mozilla"
	// refNameAnnotation names the image index in the layout's index.json.
	refNameAnnotation = "org.opencontainers.image.ref.name"
)

// The files of the base layer. The users and groups are distroless's (static:nonroot).
const (
	passwd = `root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
`
	group = `root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
`
	// nsswitch makes Go's resolver read /etc/hosts before asking DNS, as distroless does.
	nsswitch = "hosts: files dns\n"
)

// env is distroless's environment.
var env = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"SSL_CERT_FILE=" + caBundle,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hack/image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: image build [flags] | image push [flags] REFERENCE")
	}
	switch args[0] {
	case "build":
		fs := flag.NewFlagSet("build", flag.ContinueOnError)
		out := fs.String("out", "bin/image", "output folder: oci/ (the OCI layout), quartermaster.oci.tar, digest")
		platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma list of os/arch")
		tag := fs.String("tag", "dev", "the tag the layout's index.json names the image index with")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 0 {
			return fmt.Errorf("build takes no arguments, got %q", fs.Args())
		}
		plats, err := parsePlatforms(*platforms)
		if err != nil {
			return err
		}
		epoch, err := sourceDateEpoch(ctx)
		if err != nil {
			return err
		}
		start := time.Now()
		digest, err := build(ctx, buildOptions{
			Out: *out, Platforms: plats, Epoch: epoch, Revision: gitRevision(ctx, os.Stderr), Tag: *tag,
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "built %s (%s) in %s: %s\n", *out, *platforms, time.Since(start).Round(100*time.Millisecond), digest)
		return nil
	case "push":
		fs := flag.NewFlagSet("push", flag.ContinueOnError)
		dir := fs.String("layout", "bin/image/oci", "the OCI layout that build wrote")
		insecure := fs.Bool("insecure", false, "allow plain HTTP (loopback and private addresses are allowed anyway)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return errors.New("usage: image push [--layout DIR] [--insecure] REGISTRY/REPOSITORY:TAG")
		}
		var opts []name.Option
		if *insecure {
			opts = append(opts, name.Insecure)
		}
		ref, err := name.NewTag(fs.Arg(0), opts...)
		if err != nil {
			return err
		}
		digest, err := push(ctx, *dir, ref)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pushed %s@%s\n", ref.String(), digest)
		return nil
	default:
		return fmt.Errorf("unknown command %q: build or push", args[0])
	}
}

// platform is one os/arch the index holds an image for.
type platform struct{ OS, Arch string }

func (p platform) String() string { return p.OS + "/" + p.Arch }

func parsePlatforms(s string) ([]platform, error) {
	var out []platform
	for p := range strings.SplitSeq(s, ",") {
		osName, arch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || osName != "linux" || arch == "" || strings.Contains(arch, "/") {
			return nil, fmt.Errorf("platform %q: want linux/<arch>", p)
		}
		out = append(out, platform{OS: osName, Arch: arch})
	}
	return out, nil
}

// sourceDateEpoch is the time every file and config of the image carries: SOURCE_DATE_EPOCH when
// set, else the commit's time, else 0 (outside a git checkout).
func sourceDateEpoch(ctx context.Context) (int64, error) {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		epoch, err := strconv.ParseInt(s, 10, 64)
		if err != nil || epoch < 0 {
			return 0, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", s)
		}
		return epoch, nil
	}
	out, err := exec.CommandContext(ctx, "git", "log", "-1", "--format=%ct").Output()
	if err != nil {
		return 0, nil //nolint:nilerr // not a git checkout: the documented fallback is 0
	}
	epoch, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the commit's time %q: %w", out, err)
	}
	return epoch, nil
}

// gitRevision is the commit the build is made from: "" outside a git checkout, or when the tree
// holds changes the commit does not (the image would not be that commit's).
func gitRevision(ctx context.Context, stderr io.Writer) string {
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	changes, err := exec.CommandContext(ctx, "git", "status", "--porcelain").Output()
	if err != nil || len(bytes.TrimSpace(changes)) != 0 {
		fmt.Fprintln(stderr, "hack/image: the tree differs from its commit: the index names no revision")
		return ""
	}
	return strings.TrimSpace(string(out))
}

type buildOptions struct {
	Out       string
	Platforms []platform
	// Epoch is the modification time of every file, the configs' creation time and the index's
	// org.opencontainers.image.created.
	Epoch int64
	// Revision, when set, is the index's org.opencontainers.image.revision: the commit, when the
	// tree is that commit's.
	Revision string
	Tag      string
}

// build writes the image index and returns its digest.
func build(ctx context.Context, o buildOptions) (v1.Hash, error) {
	if len(o.Platforms) == 0 {
		return v1.Hash{}, errors.New("no platform")
	}
	if err := checkGNUTar(ctx); err != nil {
		return v1.Hash{}, err
	}
	work, err := os.MkdirTemp("", "quartermaster-image-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(work)
	created := time.Unix(o.Epoch, 0).UTC()

	// The layers' tarballs are read again when the layout is written, so they stay in work/.
	base, err := baseLayer(ctx, filepath.Join(work, "base"), o.Epoch)
	if err != nil {
		return v1.Hash{}, err
	}
	binaries := make([]v1.Layer, len(o.Platforms))
	g, gctx := errgroup.WithContext(ctx)
	for i, p := range o.Platforms {
		g.Go(func() error {
			var err error
			binaries[i], err = binaryLayer(gctx, filepath.Join(work, p.OS+"-"+p.Arch), p, o.Epoch)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return v1.Hash{}, err
	}

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for i, p := range o.Platforms {
		img, err := platformImage(p, created, base, binaries[i])
		if err != nil {
			return v1.Hash{}, fmt.Errorf("%s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Arch}},
		})
	}
	annotations := map[string]string{
		"org.opencontainers.image.created": created.Format(time.RFC3339),
		"org.opencontainers.image.title":   binaryName,
	}
	if o.Revision != "" {
		annotations["org.opencontainers.image.revision"] = o.Revision
	}
	idx = mutate.Annotations(idx, annotations).(v1.ImageIndex)
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	if err := writeOutputs(ctx, o.Out, idx, o.Tag, o.Epoch); err != nil {
		return v1.Hash{}, err
	}
	return digest, nil
}

// checkGNUTar fails with a clear message when tar is not GNU tar (its options make the layers
// reproducible).
func checkGNUTar(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "tar", "--version").Output()
	if err != nil || !bytes.Contains(out, []byte("GNU tar")) {
		return errors.New("GNU tar is needed (its --sort, --mtime and --pax-option make the layers reproducible): install the Debian package tar, or put GNU tar first in PATH as tar")
	}
	return nil
}

// tarArgs are GNU tar's options for a reproducible archive: names sorted, one modification time,
// numeric owners (root unless said otherwise), POSIX format without access and change times, and
// extended headers (long names) named without the process ID GNU tar puts there by default.
func tarArgs(epoch int64) []string {
	return []string{
		"--sort=name", "--mtime=@" + strconv.FormatInt(epoch, 10),
		"--owner=0", "--group=0", "--numeric-owner", "--format=posix",
		"--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
	}
}

func runTar(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "tar", args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("tar %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// baseLayer makes the platform-independent layer in dir. GNU tar gives one owner to a whole run,
// so the tarball is made in three runs, in name order: etc/ and home/ (root's), home/nonroot/
// (nonroot's), root/ and tmp/ (root's).
func baseLayer(ctx context.Context, dir string, epoch int64) (v1.Layer, error) {
	certs, err := debianCABundle()
	if err != nil {
		return nil, err
	}
	type entry struct {
		path string
		mode os.FileMode // with os.ModeDir for folders
		data string
	}
	trees := []struct {
		dir, owner string
		entries    []entry
	}{
		{"root-first", "0", []entry{
			{"etc", os.ModeDir | 0o755, ""},
			{"etc/group", 0o644, group},
			{"etc/nsswitch.conf", 0o644, nsswitch},
			{"etc/passwd", 0o644, passwd},
			{"etc/ssl", os.ModeDir | 0o755, ""},
			{"etc/ssl/certs", os.ModeDir | 0o755, ""},
			{strings.TrimPrefix(caBundle, "/"), 0o644, certs},
			{"home", os.ModeDir | 0o755, ""},
		}},
		{"nonroot", strconv.Itoa(nonRoot), []entry{
			{"home/nonroot", os.ModeDir | 0o700, ""},
		}},
		{"root-last", "0", []entry{
			{"root", os.ModeDir | 0o700, ""},
			{"tmp", os.ModeDir | os.ModeSticky | 0o777, ""},
		}},
	}
	tarball := filepath.Join(dir, "layer.tar")
	for i, tree := range trees {
		root := filepath.Join(dir, tree.dir)
		names := make([]string, 0, len(tree.entries))
		for _, e := range tree.entries {
			p := filepath.Join(root, filepath.FromSlash(e.path))
			if e.mode.IsDir() {
				err = os.MkdirAll(p, 0o700)
			} else {
				err = os.WriteFile(p, []byte(e.data), 0o600)
			}
			if err == nil {
				// Set explicitly: the umask does not get into the image.
				err = os.Chmod(p, e.mode)
			}
			if err != nil {
				return nil, err
			}
			names = append(names, e.path)
		}
		mode := "--append"
		if i == 0 {
			mode = "--create"
		}
		args := append([]string{mode, "--file", tarball}, tarArgs(epoch)...)
		// --no-recursion with every entry named: each run holds exactly its entries, in this order.
		args = append(args, "--owner="+tree.owner, "--group="+tree.owner, "--no-recursion", "--directory", root)
		if err := runTar(ctx, append(args, names...)...); err != nil {
			return nil, err
		}
	}
	return layerFromTarball(tarball)
}

// debianCABundle is the bundle update-ca-certificates makes from Debian's ca-certificates package
// alone: its certificates in name order, each ending with a newline.
func debianCABundle() (string, error) {
	files, err := filepath.Glob(filepath.Join(debianCerts, "*.crt"))
	if err == nil && len(files) == 0 {
		err = fmt.Errorf("no certificate in %s", debianCerts)
	}
	if err != nil {
		return "", fmt.Errorf("the image's CA certificates come from Debian's ca-certificates package, which is not installed here (%w): run hack/image.sh as root, or apt-get install ca-certificates", err)
	}
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		b.Write(data)
		if len(data) > 0 && data[len(data)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}

// binaryLayer builds the static manager for p and makes its layer in dir.
func binaryLayer(ctx context.Context, dir string, p platform, epoch int64) (v1.Layer, error) {
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	// The Dockerfile builds with the same flags.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=",
		"-o", filepath.Join(root, binaryName), "./cmd/quartermaster")
	cmd.Dir = repoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch,
		// The baseline of each architecture, whatever the build machine's environment says.
		"GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build for %s: %w\n%s", p, err, out)
	}
	tarball := filepath.Join(dir, "layer.tar")
	args := append([]string{"--create", "--file", tarball}, tarArgs(epoch)...)
	args = append(args, "--mode=0755", "--directory", root, binaryName)
	if err := runTar(ctx, args...); err != nil {
		return nil, err
	}
	return layerFromTarball(tarball)
}

// layerFromTarball is an OCI layer of the tarball at path, gzipped once (and kept in memory).
func layerFromTarball(path string) (v1.Layer, error) {
	return tarball.LayerFromFile(path,
		tarball.WithMediaType(types.OCILayer),
		tarball.WithCompressionLevel(gzip.DefaultCompression),
		tarball.WithCompressedCaching)
}

// platformImage is the image for p: the base layer, the binary's, and the config.
func platformImage(p platform, created time.Time, base, binary v1.Layer) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	at := v1.Time{Time: created}
	img, err := mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{
			Created: at, CreatedBy: "hack/image: passwd, group, nsswitch.conf, CA certificates, /home/nonroot, /root, /tmp",
		}},
		mutate.Addendum{Layer: binary, MediaType: types.OCILayer, History: v1.History{
			Created: at, CreatedBy: "hack/image: " + entrypoint,
		}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Arch
	cf.Created = at
	cf.Config = v1.Config{
		User:       user,
		Entrypoint: []string{entrypoint},
		Env:        env,
		WorkingDir: "/home/nonroot",
	}
	return mutate.ConfigFile(img, cf)
}

// writeOutputs writes the layout (replacing an older one), its tarball and the digest file.
func writeOutputs(ctx context.Context, out string, idx v1.ImageIndex, tag string, epoch int64) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	dir := filepath.Join(out, "oci")
	tmp := dir + ".new"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refNameAnnotation: tag})); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	archive := filepath.Join(out, binaryName+".oci.tar")
	args := append([]string{"--create", "--file", archive + ".new"}, tarArgs(epoch)...)
	args = append(args, "--mode=u=rwX,go=rX", "--directory", dir, "oci-layout", "index.json", "blobs")
	if err := runTar(ctx, args...); err != nil {
		return err
	}
	if err := os.Rename(archive+".new", archive); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "digest"), []byte(digest.String()+"\n"), 0o644)
}

// layoutIndex is the image index a layout written by build holds.
func layoutIndex(dir string) (v1.ImageIndex, error) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the OCI layout %s (run make image first): %w", dir, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 || m.Manifests[0].MediaType != types.OCIImageIndex {
		return nil, fmt.Errorf("%s/index.json: want one image index, found %d descriptors", dir, len(m.Manifests))
	}
	return top.ImageIndex(m.Manifests[0].Digest)
}

// push pushes the layout's image index to ref and returns its digest.
func push(ctx context.Context, dir string, ref name.Tag) (v1.Hash, error) {
	idx, err := layoutIndex(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return v1.Hash{}, fmt.Errorf("pushing %s: %w", ref, err)
	}
	return idx.Digest()
}

// repoRoot is the module's top folder: the go command knows it from any folder inside.
func repoRoot() string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil {
		if mod := strings.TrimSpace(string(out)); mod != "" && mod != os.DevNull {
			return filepath.Dir(mod)
		}
	}
	return "."
}
