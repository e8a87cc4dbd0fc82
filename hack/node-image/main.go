// Command node-image makes an image archive from static binaries, for a node with no registry
// (hack/real-cluster.sh imports them into the node's containerd with ctr):
//
//	go run ./hack/node-image --out pause.tar --ref docker.io/local/pause:1 --entrypoint /pause \
//		--build ./hack/node-image/pause=/pause
//	go run ./hack/node-image --out coredns.tar --ref docker.io/local/coredns:v1.15.0 --entrypoint /coredns \
//		--file /path/to/coredns=/coredns
//
// The archive is a docker-archive (what `ctr images import` and `docker load` read) of one image
// for the machine's platform: one layer holding each file at its path, mode 0755, owned by root;
// the config runs --entrypoint. --build compiles a Go package of this module (static, CGO off)
// first. --user sets the config's user (default: root, as the programs it is for expect).
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type pairs []string

func (p *pairs) String() string     { return strings.Join(*p, ",") }
func (p *pairs) Set(s string) error { *p = append(*p, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "node-image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("node-image", flag.ContinueOnError)
	out := fs.String("out", "", "the archive to write")
	ref := fs.String("ref", "", "the image's name in the archive, e.g. docker.io/local/pause:1")
	entrypoint := fs.String("entrypoint", "", "the program the image runs")
	user := fs.String("user", "", "the config's user (empty: root)")
	var files, builds pairs
	fs.Var(&files, "file", "SOURCE=PATH: a file of this machine at PATH in the image (repeatable)")
	fs.Var(&builds, "build", "PACKAGE=PATH: a Go package of this module, built static, at PATH (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *ref == "" || *entrypoint == "" || len(files)+len(builds) == 0 {
		return errors.New("--out, --ref, --entrypoint and at least one --file or --build are required")
	}
	tag, err := name.NewTag(*ref)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "node-image")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for i, b := range builds {
		pkg, path, ok := strings.Cut(b, "=")
		if !ok {
			return fmt.Errorf("--build %q: want PACKAGE=PATH", b)
		}
		bin := filepath.Join(tmp, fmt.Sprintf("bin%d", i))
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build %s: %w", pkg, err)
		}
		files = append(files, bin+"="+path)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, f := range files {
		src, path, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(path, "/") {
			return fmt.Errorf("--file %q: want SOURCE=/PATH", f)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{
			Name: strings.TrimPrefix(path, "/"), Mode: 0o755, Size: int64(len(data)),
			Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX,
		}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layer.Bytes())), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Entrypoint: []string{*entrypoint}, User: *user,
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	if err := tarball.WriteToFile(*out+".tmp", tag, img); err != nil {
		return err
	}
	return os.Rename(*out+".tmp", *out)
}
