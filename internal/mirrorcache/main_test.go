package mirrorcache

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/mirrorcache/peerset"
	"github.com/quartermaster-dev/quartermaster/internal/testing/dnstest"
)

// envChildCache makes the test binary run a cache as its own process (the configuration file
// named; its storage and listen addresses from the variables below, as registry-mirror's flags
// give them), so a test can kill it.
const (
	envChildCache       = "QM_TEST_CHILD_CACHE_CONFIG"
	envChildStorage     = "QM_TEST_CHILD_STORAGE"
	envChildAddr        = "QM_TEST_CHILD_ADDR"
	envChildMetricsAddr = "QM_TEST_CHILD_METRICS_ADDR"
	envChildFileLimit   = "QM_TEST_CHILD_FILE_SIZE_LIMIT"
	// A replica: its name, its peer port's address and the fixed list of replicas.
	envChildPeerName = "QM_TEST_CHILD_PEER_NAME"
	envChildPeerAddr = "QM_TEST_CHILD_PEER_ADDR"
	envChildPeers    = "QM_TEST_CHILD_PEERS"
	// Or the replicas looked up as the registry-mirror subcommand's --peers-service does: the
	// headless Service's name and the DNS server the process resolves every name with (the
	// test's, in place of the system's).
	envChildPeersService = "QM_TEST_CHILD_PEERS_SERVICE"
	envChildDNS          = "QM_TEST_CHILD_DNS"
)

// childLookupInterval is how often a child looks its peers up (5 s in a pod): a test waits
// for every replica to see a change of the replicas.
const childLookupInterval = 100 * time.Millisecond

// TestMain makes the test binary a cache run as a process when envChildCache says so.
func TestMain(m *testing.M) {
	if config := os.Getenv(envChildCache); config != "" {
		// A volume that refuses writes past this size (EFBIG), for the tests of a full volume.
		if limit, err := strconv.ParseUint(os.Getenv(envChildFileLimit), 10, 64); err == nil {
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: limit, Max: limit}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		opts := Options{ConfigPath: config, CredentialsDir: os.TempDir(),
			StorageDir: os.Getenv(envChildStorage), Addr: os.Getenv(envChildAddr), MetricsAddr: os.Getenv(envChildMetricsAddr)}
		if list := os.Getenv(envChildPeers); list != "" {
			members, err := peerset.ParseList(list)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			opts.Peers = &PeerOptions{Addr: os.Getenv(envChildPeerAddr), Set: peerset.New(os.Getenv(envChildPeerName), members)}
		}
		if service := os.Getenv(envChildPeersService); service != "" {
			// As registry-mirror wires --peers-service, with the process's resolver (which also
			// finds the peers' host names when the cache dials them) sent to the test's DNS.
			net.DefaultResolver = dnstest.Resolver(os.Getenv(envChildDNS))
			opts.Peers = &PeerOptions{Addr: os.Getenv(envChildPeerAddr), Set: peerset.New(os.Getenv(envChildPeerName), nil),
				Lookup: peerset.LookupSRV(net.DefaultResolver, mirror.PeerPortName, service), LookupInterval: childLookupInterval}
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		err := Run(ctx, opts)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
