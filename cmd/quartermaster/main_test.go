package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/mirrorcache/peerset"
	"github.com/quartermaster-dev/quartermaster/internal/nsclient"
	"github.com/quartermaster-dev/quartermaster/internal/testing/chart"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestRequestFlagsBeforeOrAfterTheName: kubectl's convention, the issue's own command line first.
func TestRequestFlagsBeforeOrAfterTheName(t *testing.T) {
	want := nsclient.Request{Name: "ci-good", RequestsNamespace: "team-requests", TTL: time.Hour, TokenTTL: 30 * time.Minute,
		Timeout: 2 * time.Minute, KubeconfigPath: "out.kubeconfig"}
	for _, args := range [][]string{
		{"ci-good", "--requests-namespace", "team-requests", "--ttl=1h", "--token-ttl", "30m", "--kubeconfig-out=out.kubeconfig"},
		{"ci-good", "--requests-namespace=team-requests", "--ttl", "1h", "--token-ttl=30m", "--kubeconfig-out", "out.kubeconfig"},
		{"--requests-namespace", "team-requests", "--ttl=1h", "--token-ttl", "30m", "--kubeconfig-out=out.kubeconfig", "ci-good"},
		{"--requests-namespace=team-requests", "--ttl", "1h", "ci-good", "--token-ttl=30m", "--kubeconfig-out", "out.kubeconfig"},
		{"-requests-namespace=team-requests", "-ttl", "1h", "-token-ttl=30m", "-kubeconfig-out", "out.kubeconfig", "ci-good"}, // Go's form
	} {
		got, _, err := requestFlags(args, io.Discard)
		if err != nil || got != want {
			t.Errorf("%q:\n got %+v, %v\nwant %+v", args, got, err, want)
		}
	}
	got, _, err := requestFlags([]string{"ci-good"}, io.Discard)
	if err != nil || got != (nsclient.Request{Name: "ci-good", RequestsNamespace: "namespace-requests", Timeout: 2 * time.Minute, KubeconfigPath: "kubeconfig"}) {
		t.Errorf("defaults: %+v, %v", got, err)
	}
}

func TestRequestWantsOneName(t *testing.T) {
	for _, args := range [][]string{{}, {"--ttl=1h"}, {"a", "b"}, {"a", "--ttl", "1h", "b"}} {
		_, _, err := requestFlags(args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "want exactly one argument") || !strings.Contains(err.Error(), "see 'quartermaster request --help'") {
			t.Errorf("%q: %v", args, err)
		}
	}
	// The name is read whatever the order, so the command gets as far as looking for its cluster.
	err := request(context.Background(), []string{"ci-good", "--requests-namespace", "namespace-requests", "--kubeconfig", filepath.Join(t.TempDir(), "none")})
	if err == nil || !strings.Contains(err.Error(), "no API server to talk to") {
		t.Errorf("flags after the name: %v", err)
	}
}

// TestKeylessRequestFlags: the keyless path takes the exchange and the token, and no name.
func TestKeylessRequestFlags(t *testing.T) {
	_, k, err := requestFlags([]string{"--exchange-url", "https://qm.example.com", "--id-token-env", "QM_ID_TOKEN", "--ttl", "2h"}, io.Discard)
	if err != nil || k != (keyless{url: "https://qm.example.com", tokenEnv: "QM_ID_TOKEN"}) {
		t.Errorf("keyless flags: %+v, %v", k, err)
	}
	for args, want := range map[string][]string{
		"a keyless request takes no NAME": {"ci-pr-42", "--exchange-url", "https://qm.example.com", "--id-token-file", "tok"},
		"needs --exchange-url":            {"--id-token-file", "tok"},
		"exactly one of --id-token-file":  {"--exchange-url", "https://qm.example.com"},
		"exactly one of --id-token-file ": {"--exchange-url", "https://qm.example.com", "--id-token-file", "tok", "--id-token-env", "T"},
	} {
		if _, _, err := requestFlags(want, io.Discard); err == nil || !strings.Contains(err.Error(), strings.TrimSpace(args)) {
			t.Errorf("%q: %v, want %q", want, err, args)
		}
	}
	t.Setenv("QM_EMPTY_TOKEN", "")
	err = request(context.Background(), []string{"--exchange-url", "https://qm.example.com", "--id-token-env", "QM_EMPTY_TOKEN"})
	if err == nil || !strings.Contains(err.Error(), "QM_EMPTY_TOKEN: the variable is empty or unset") {
		t.Errorf("an empty token variable: %v", err)
	}
}

func TestRequestHelpShowsExamples(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"ci-good", "-h"}} {
		var out strings.Builder
		_, _, err := requestFlags(args, &out)
		if !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%q: %v, want flag.ErrHelp", args, err)
		}
		for _, want := range []string{
			"quartermaster request [flags] NAME | --exchange-url URL --id-token-file FILE", "Examples:", "quartermaster request ci-pr-42 --ttl=2h",
			"quartermaster request --requests-namespace team-requests --timeout 30s ci-pr-42",
			`--requests-namespace string   the namespace whose ConfigMaps are requests (the controller's --requests-namespace) (default "namespace-requests")`,
			"--kubeconfig string", "--ttl duration", "--timeout duration", "(default 2m0s)",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%q: the help lacks %q:\n%s", args, want, out.String())
			}
		}
	}
}

// TestEveryShippedCommandLineStillParses: the command lines the repository runs the binary with
// (the chart's renders, config/manager, the mirrors controller's cache and agent workloads) are
// read by every command's parser, with Go's single-dash spelling of the same flags too.
func TestEveryShippedCommandLineStillParses(t *testing.T) {
	root := testenv.RepoRoot()
	var managerArgs [][]string
	for _, file := range []string{"config/manager/manager.yaml", "test/chart/testdata/default.golden.yaml",
		"test/chart/testdata/all.golden.yaml", "test/chart/testdata/minimal.golden.yaml"} {
		manifest, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := chart.Objects(manifest)
		if err != nil {
			t.Fatal(err)
		}
		args := containerArgs(t, chart.Find(objs, "Deployment", "quartermaster-manager"))
		if len(args) < 4 {
			t.Fatalf("%s: the manager's args %q", file, args)
		}
		managerArgs = append(managerArgs, args)
	}
	for _, args := range managerArgs {
		for _, args := range [][]string{args, singleDash(args)} {
			if _, err := manager.ParseFlags(args, hosted(), io.Discard); err != nil {
				t.Errorf("manager %q: %v", args, err)
			}
		}
	}
	o, err := manager.ParseFlags([]string{"-leader-elect", "-zap-log-level", "debug", "--controllers", "namespaces", "-vsphere-insecure=false"}, hosted(), io.Discard)
	if err != nil || !o.LeaderElect || o.Controllers != "namespaces" || o.Zap.Level == nil {
		t.Errorf("manager, mixed forms: %+v, %v", o, err)
	}

	in := mirror.Install{Namespace: "quartermaster-mirrors", Image: "quartermaster:test", AgentServiceAccount: "quartermaster-node-agent", CacheServiceAccount: "quartermaster-mirror-cache"}
	s, err := mirror.Resolve(&registryv1alpha1.RegistryMirror{ObjectMeta: metav1.ObjectMeta{Name: "hub"},
		Spec: registryv1alpha1.RegistryMirrorSpec{UpstreamURL: "https://registry-1.docker.io"}})
	if err != nil {
		t.Fatal(err)
	}
	sts := mirror.StatefulSet(in, s, "hash").Spec.Template.Spec.Containers[0].Args
	agent := mirror.AgentDaemonSet(in, s, "http://10.96.0.12:5000").Spec.Template.Spec.Containers[0].Args
	if sts[0] != "registry-mirror" || agent[0] != "node-agent" {
		t.Fatalf("rendered commands %q and %q", sts, agent)
	}
	for _, args := range [][]string{sts[1:], singleDash(sts[1:])} {
		o, report, err := registryMirrorFlags(args, io.Discard)
		if err != nil || o.ConfigPath != filepath.Join(mirror.ConfigDir, mirror.ConfigFile) || o.CredentialsDir != mirror.ConfigDir || !report {
			t.Errorf("registry-mirror %q: %+v, report to the Pod %v, %v", args, o, report, err)
		}
		// The replicas find each other through the headless Service; the pod's name (expanded
		// by the kubelet) is its own among them: it keeps its share of the digests.
		if err == nil && (o.Peers == nil || o.Peers.Lookup == nil || o.Peers.Addr != ":"+strconv.Itoa(mirror.PeerPort)) {
			t.Errorf("registry-mirror %q: peers %+v", args, o.Peers)
		} else if err == nil {
			o.Peers.Set.Replace([]peerset.Peer{{Name: "$(POD_NAME)", Addr: "x:1"}, {Name: "other", Addr: "y:1"}})
			if got := ownerAddrs(o.Peers.Set); !maps.Equal(got, map[string]bool{"": true, "y:1": true}) {
				t.Errorf("registry-mirror %q: digests go to %v, want some kept by $(POD_NAME) and the rest to the other pod", args, got)
			}
		}
	}
	for _, args := range [][]string{agent[1:], singleDash(agent[1:])} {
		cfg, _, probe, err := nodeAgentFlags(args, io.Discard)
		if err != nil || cfg.Mirror != "hub" || cfg.Endpoint != "http://10.96.0.12:5000" || cfg.Root != mirror.HostRoot || probe != ":"+strconv.Itoa(mirror.AgentProbePort) {
			t.Errorf("node-agent %q: %+v probe %q, %v", args, cfg, probe, err)
		}
	}
	// As test/e2e runs the agent, with the flags after an argument-less command.
	cfg, zopts, probe, err := nodeAgentFlags([]string{"--mirror=hub", "--resync", "1s", "--probe-address=127.0.0.1:0", "--zap-devel"}, io.Discard)
	if err != nil || cfg.Resync != time.Second || probe != "127.0.0.1:0" || !zopts.Development {
		t.Errorf("node-agent as e2e runs it: %+v %q, %v", cfg, probe, err)
	}
	if _, _, err := registryMirrorFlags([]string{"stray"}, io.Discard); err == nil || !strings.Contains(err.Error(), "takes no arguments") {
		t.Errorf("registry-mirror with an argument: %v", err)
	}
	mo, _, err := registryMirrorFlags([]string{"--peers=b=127.0.0.1:2,a=127.0.0.1:1", "--peer-name=a", "--peer-address=127.0.0.1:0"}, io.Discard)
	if err != nil || mo.Peers == nil || mo.Peers.Lookup != nil {
		t.Errorf("registry-mirror with a fixed peer list: %+v, %v", mo.Peers, err)
	} else if got := ownerAddrs(mo.Peers.Set); !maps.Equal(got, map[string]bool{"": true, "127.0.0.1:2": true}) {
		t.Errorf("registry-mirror with a fixed peer list: digests go to %v, want some kept by a and the rest to b", got)
	}
	// As test/e2e and the bench run the cache as a process beside others.
	po, _, err := registryMirrorFlags([]string{"--config=/c.yml", "--address=127.0.0.1:1", "--metrics-address=127.0.0.1:2", "--storage-dir=/s", "--zap-log-level=error"}, io.Discard)
	if err != nil || po.ConfigPath != "/c.yml" || po.Addr != "127.0.0.1:1" || po.MetricsAddr != "127.0.0.1:2" || po.StorageDir != "/s" ||
		po.LogFlags == nil || po.LogFlags.Level == nil || po.Peers != nil {
		t.Errorf("registry-mirror as a process: %+v, %v", po, err)
	}
	// The cache has one way to authenticate: no credential helper subcommand ("get") is left.
	if _, ok := subcommands["get"]; ok {
		t.Error(`the binary still has the subcommand "get" (distribution's credential helper)`)
	}
	for _, bad := range [][]string{{"--peers=a", "--peer-name=a"}, {"--peers=a=h:1", "--peers-service=s"}} {
		if _, _, err := registryMirrorFlags(bad, io.Discard); err == nil {
			t.Errorf("registry-mirror %q accepted", bad)
		}
	}
}

func containerArgs(t *testing.T, d *unstructured.Unstructured) []string {
	t.Helper()
	if d == nil {
		t.Fatal("no Deployment quartermaster-manager")
	}
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	var args []string
	for _, a := range containers[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	return args
}

// singleDash spells --flag as the flag package also accepted it, -flag.
func singleDash(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.Replace(a, "--", "-", 1)
	}
	return out
}

// ownerAddrs is where set sends the digests of 100 keys: the peer addresses of the other pods
// owning some, and "" when it keeps some itself (its own name is among the members).
func ownerAddrs(set *peerset.Set) map[string]bool {
	out := map[string]bool{}
	for i := range 100 {
		owner, _ := set.Owner(fmt.Sprintf("sha256:%064x", i))
		out[owner.Addr] = true
	}
	return out
}
