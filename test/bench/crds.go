package main

import (
	"context"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// installCRDs applies the named files of config/crd/bases and waits until they are served.
func installCRDs(ctx context.Context, e *env, files ...string) error {
	args := []string{"apply", "--server-side"}
	for _, f := range files {
		args = append(args, "-f", filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", f))
	}
	if _, err := e.cluster.Kubectl(ctx, args...); err != nil {
		return err
	}
	return waitEstablished(ctx, e)
}

// installAllCRDs applies every CRD of config/crd/bases.
func installAllCRDs(ctx context.Context, e *env) error {
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "*.yaml"))
	if err != nil {
		return err
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	return installCRDs(ctx, e, names...)
}

// waitEstablished polls until every CRD is Established. (kubectl wait reports a CRD that has no
// conditions yet as an error instead of waiting for it.)
func waitEstablished(ctx context.Context, e *env) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		// A failed get is polled again, like a CRD not yet established.
		out, err := e.cluster.Kubectl(ctx, "get", "crd", "-o",
			`jsonpath={range .items[*]}{.status.conditions[?(@.type=="Established")].status}{","}{end}`)
		established := err == nil
		for _, s := range strings.Split(strings.TrimSuffix(out, ","), ",") {
			established = established && s == "True"
		}
		return established, nil
	})
}
