// Command iam-emulator serves the project's in-memory AWS IAM emulator (package
// internal/testing/iamemulator) over HTTP, for the local cluster, e2e tests and the demo.
//
//	iam-emulator --listen 127.0.0.1:4566 --fail-rate 0.1 --fail-kinds throttle,5xx
//
// Point the AWS SDK at it with BaseEndpoint (or AWS_ENDPOINT_URL_IAM / AWS_ENDPOINT_URL_STS, and
// AWS_ENDPOINT_URL_EKS for the Pod Identity associations of the --eks-clusters).
// GET /_emulator/state dumps the state as JSON, POST /_emulator/reset empties it, and
// POST /_emulator/faults?rate=R&kinds=K changes fault injection.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

func main() {
	if err := run(); err != nil {
		log.Fatalf("iam-emulator: %v", err)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:4566", "address to listen on (port 0 picks a free port)")
	failRate := flag.Float64("fail-rate", 0, "probability (0.0-1.0) that a request fails with an injected fault")
	failKinds := flag.String("fail-kinds", "throttle,5xx", "comma list of injected faults: throttle (400 Throttling), 5xx (503 ServiceUnavailable)")
	accountID := flag.String("account-id", iamemulator.DefaultAccountID, "AWS account ID in ARNs and GetCallerIdentity")
	seed := flag.Uint64("seed", 0, "seed for fault injection and generated IDs (0: random)")
	eksClusters := flag.String("eks-clusters", "", "comma list of EKS cluster names whose Pod Identity associations are served (AWS_ENDPOINT_URL_EKS)")
	flag.Parse()

	if *failRate < 0 || *failRate > 1 {
		return fmt.Errorf("--fail-rate must be between 0.0 and 1.0, got %v", *failRate)
	}
	kinds, err := iamemulator.ParseFaultKinds(*failKinds)
	if err != nil {
		return fmt.Errorf("--fail-kinds: %w", err)
	}
	if len(*accountID) != 12 || strings.Trim(*accountID, "0123456789") != "" {
		return fmt.Errorf("--account-id must be 12 digits, got %q", *accountID)
	}

	var clusters []string
	for c := range strings.SplitSeq(*eksClusters, ",") {
		if c = strings.TrimSpace(c); c != "" {
			clusters = append(clusters, c)
		}
	}
	emu := iamemulator.New(iamemulator.Options{
		AccountID: *accountID, FailRate: *failRate, FailKinds: kinds, Seed: *seed, EKSClusters: clusters,
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: emu, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("iam-emulator listening on http://%s (account %s, EKS clusters %v, fail-rate %v, fail-kinds %v)",
		ln.Addr(), *accountID, clusters, *failRate, kinds)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
