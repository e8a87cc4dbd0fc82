// Command bench starts a local kwok cluster and prints Quartermaster's benchmark report. Every
// figure in one report comes from the same run on the same cluster, so ratios between them hold
// even on a noisy machine; absolute numbers do not carry across machines.
//
//	go run ./test/bench [-cases REGEXP] [-keep-cluster] [-cluster NAME]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"runtime/pprof"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"
	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/memlimit"
	"github.com/quartermaster-dev/quartermaster/internal/testing/localcluster"
)

// clusterName is the local cluster the report runs on (-cluster: two reports at once need two).
var clusterName = "qm-bench"

// env is what every case gets: the cluster and an admin client without client-side rate limits.
type env struct {
	cluster *localcluster.Cluster
	client  client.Client
}

// result is one line of the report.
type result struct {
	metric string
	value  float64
	unit   string
	note   string
}

type benchCase struct {
	name string
	run  func(ctx context.Context, e *env) ([]result, error)
}

// cases run in order; controllers add theirs here.
var cases = []benchCase{
	{name: "floor/bare-client-writes", run: floorWrites},
	// The memory case first: the cluster then holds no namespace of the controller's but the
	// requests it measures (the manager caches every namespace it labelled, whichever case made it).
	{name: "namespaces/latency-and-memory", run: namespacesProcessBench},
	{name: "namespaces/1000-requests", run: namespacesBench},
	{name: "namespaces/keyless-exchange", run: keylessBench},
	{name: "namespaces/keyless-memory", run: keylessMemoryBench},
	{name: "vmgroups/50-replicas", run: vmgroupsBench},
	{name: "iam/500-serviceaccounts", run: iamBench},
	{name: "iam/500-podidentity-serviceaccounts", run: iamPodIdentityBench},
	{name: "intents/1000-bindings", run: intentsBench},
	{name: "intents/cluster-binding-500-namespaces", run: clusterBindingBench},
	{name: "intents/impact-500-namespaces", run: impactBench},
	{name: "mirrors/50-mirrors", run: mirrorsBench},
	{name: "mirrors/cache-data-path", run: cacheDataPathBench},
	{name: "mirrors/cache-replicas", run: cacheReplicasBench},
	{name: "mirrors/upstream-refusing", run: refusingUpstreamBench},
	{name: "mirrors/eviction-under-churn", run: evictionChurnBench},
	{name: "mirrors/rollout-after-prewarm", run: prewarmRolloutBench},
	{name: "mirrors/pins-10000-pods", run: pinsBench},
	{name: "manager/every-controller-unrelated-objects", run: cachesBench},
	{name: "manager/failover-under-kill", run: failoverBench},
	// On a real node of its own (root): helm install, Pods pulling through the mirror.
	{name: "realnode/pod-start-through-mirror", run: realNodeBench},
}

func main() {
	pattern := flag.String("cases", ".", "run only the cases whose name matches this regular expression")
	keep := flag.Bool("keep-cluster", false, "leave the benchmark cluster running afterwards")
	flag.StringVar(&clusterName, "cluster", clusterName, "name of the local cluster the benchmark starts (and deletes first if it exists)")
	flag.StringVar(&profilesDir, "profiles", "", "save into this directory a heap profile and the memory map (smaps) of the manager process wherever a case measures its RSS")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (the bench and the in-process manager) over the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer stop()
	}
	// Controllers run in-process: show their errors, not their chatter, and collect garbage as the
	// manager binary does.
	log.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel)))
	// distribution's logger (the upstream registries the cases serve): their request lines are noise.
	logrus.SetLevel(logrus.ErrorLevel)
	memlimit.SetGCPercent()
	if err := run(*pattern, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1) //nolint:gocritic // the profile of a failed run is not wanted
	}
}

// startCPUProfile profiles this process into path until the returned func is called.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

func run(pattern string, keep bool) error {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return err
	}
	binDir, err = os.MkdirTemp("", "qm-bench-bin")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	// A fresh cluster each run: leftovers from an earlier run would skew the figures.
	_ = localcluster.Down(clusterName)
	cl, err := localcluster.Up(clusterName, 3)
	if err != nil {
		return err
	}
	if !keep {
		defer func() { _ = localcluster.Down(clusterName) }()
	}
	c, err := client.New(cl.Config, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		return err
	}
	e := &env{cluster: cl, client: c}
	ctx := context.Background()

	fmt.Printf("Quartermaster benchmark report — %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("local kwok cluster %q, %d CPUs, %s\n\n", clusterName, runtime.NumCPU(), runtime.Version())
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CASE\tMETRIC\tVALUE\tUNIT\tNOTE")
	var failed []error
	for _, bc := range cases {
		if !re.MatchString(bc.name) {
			continue
		}
		results, err := bc.run(ctx, e)
		if err != nil {
			// The other cases still run (a long run is not lost to one case); the run fails at its end.
			fmt.Fprintf(w, "%s\tFAILED\t\t\t%v\n", bc.name, err)
			failed = append(failed, fmt.Errorf("%s: %w", bc.name, err))
			_ = w.Flush()
			continue
		}
		for _, r := range results {
			fmt.Fprintf(w, "%s\t%s\t%.1f\t%s\t%s\n", bc.name, r.metric, r.value, r.unit, r.note)
		}
		_ = w.Flush()
	}
	_ = w.Flush()
	return errors.Join(failed...)
}
