// Command demo-helper does for hack/demo.sh what a shell does badly, with the project's own code:
//
//	demo-helper free-addrs N                      N loopback addresses with a free port, one a line
//	demo-helper kubearmor-crds DIR                KubeArmor's CRDs from its Go module (as the tests install them) into DIR
//	demo-helper kyverno KUBECONFIG DIR READYFILE  run Kyverno (internal/testing/kyverno, as e2e does) until SIGTERM;
//	                                              READYFILE is written once it admits requests, and on SIGTERM both
//	                                              processes are stopped and Kyverno's webhook configurations deleted
//	demo-helper cri-pull SOCKET IMAGE             remove IMAGE from containerd at SOCKET, then pull it as a kubelet does
//	                                              (CRI PullImage, no credentials)
//	demo-helper registry-pull CACHE IMAGE         pull IMAGE's manifest, config and layers from the registry at CACHE
//	                                              (host:port, plain HTTP) instead of IMAGE's host, as containerd's
//	                                              hosts.toml makes it do (for machines where containerd cannot run)
//	demo-helper ci-issuer DIR                     stand in for a CI system until SIGTERM: a loopback OIDC issuer and
//	                                              its token endpoint for jobs, a serving certificate for the exchange
//	                                              (ciissuer.go says what it writes into DIR)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/quartermaster-dev/quartermaster/internal/testing/enginecrds"
	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
)

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: demo-helper free-addrs|kubearmor-crds|kyverno|cri-pull|registry-pull|ci-issuer ARGS"))
	}
	args := os.Args[2:]
	need := func(n int) {
		if len(args) != n {
			fail(fmt.Errorf("%s takes %d arguments, got %q", os.Args[1], n, args))
		}
	}
	var err error
	switch os.Args[1] {
	case "free-addrs":
		need(1)
		err = freeAddrs(args[0])
	case "kubearmor-crds":
		need(1)
		err = enginecrds.Copy(enginecrds.KubeArmorModule, enginecrds.KubeArmor, args[0])
	case "kyverno":
		need(3)
		err = runKyverno(args[0], args[1], args[2])
	case "cri-pull":
		need(2)
		err = criPull(args[0], args[1])
	case "registry-pull":
		need(2)
		err = registryPull(args[0], args[1])
	case "ci-issuer":
		need(1)
		err = runCIIssuer(args[0])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "demo-helper:", err)
	os.Exit(1)
}

func freeAddrs(n string) error {
	count, err := strconv.Atoi(n)
	if err != nil {
		return err
	}
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range count {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		lns = append(lns, ln)
		fmt.Println(ln.Addr())
	}
	return nil
}

// runKyverno runs Kyverno through the e2e harness; a kyverno.Program stands in for the test.
func runKyverno(kubeconfig, dir, readyFile string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := &kyverno.Program{Dir: dir}
	var k *kyverno.Kyverno
	if err := r.Run(func() { k = kyverno.Start(r, cfg) }); err != nil {
		r.Close()
		return err
	}
	if err := os.WriteFile(readyFile, []byte(k.WebhookAddr+"\n"), 0o644); err != nil {
		r.Close()
		return err
	}
	fmt.Printf("Kyverno %s is ready, its webhooks at https://%s (logs in %s)\n", kyverno.Version, k.WebhookAddr, dir)
	<-ctx.Done()
	r.Close()
	if r.Failed() {
		return errors.New("stopping Kyverno failed")
	}
	fmt.Println("Kyverno stopped; its webhook configurations are deleted")
	return nil
}

func criPull(socket, image string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	images := runtimeapi.NewImageServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// containerd was just started: wait until its CRI answers.
	for {
		if _, err = images.ListImages(ctx, &runtimeapi.ListImagesRequest{}); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd's CRI at %s does not answer: %w", socket, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	// A pull fetches what the node lacks: start from none of it, as a fresh node would.
	if _, err := images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}); err != nil {
		return fmt.Errorf("removing %s from containerd before the pull: %w", image, err)
	}
	// No credentials: a kubelet with no imagePullSecret. The cache holds the upstream's.
	resp, err := images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	if err != nil {
		return fmt.Errorf("containerd pulling %s: %w", image, err)
	}
	st, err := images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	if err != nil {
		return err
	}
	if st.Image == nil {
		return fmt.Errorf("containerd does not list %s after pulling it", image)
	}
	fmt.Printf("containerd pulled %s: image %s, %d bytes, %s\n", image, resp.ImageRef, st.Image.GetSize(), strings.Join(st.Image.RepoDigests, ", "))
	return nil
}

func registryPull(cache, image string) error {
	ref, err := name.ParseReference(image)
	if err != nil {
		return err
	}
	// The same repository and tag at the cache, as containerd's hosts.toml redirects the pull.
	viaCache, err := name.ParseReference(cache+"/"+ref.Context().RepositoryStr()+":"+ref.Identifier(), name.Insecure)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	img, err := remote.Image(viaCache, remote.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("pulling %s through the cache: %w", image, err)
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	if _, err := img.RawConfigFile(); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var size int64
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return err
		}
		size += n
	}
	fmt.Printf("pulled %s through the cache at %s: %s, %d layer(s), %d bytes\n", image, cache, d, len(layers), size)
	return nil
}
