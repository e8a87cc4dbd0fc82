package mirrorcache

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
)

// envChildCache makes the test binary run a cache as its own process (the configuration file
// named; the rest from distribution's REGISTRY_* variables), so a test can kill it.
const (
	envChildCache     = "QM_TEST_CHILD_CACHE_CONFIG"
	envChildFileLimit = "QM_TEST_CHILD_FILE_SIZE_LIMIT"
)

// TestMain makes the test binary the cache's credential helper, as the quartermaster binary is in
// a pod: a cache runs os.Executable(), here this binary, with "get".
func TestMain(m *testing.M) {
	if HelperRequested(os.Args[1:]) {
		if err := CredentialHelper(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if config := os.Getenv(envChildCache); config != "" {
		// A volume that refuses writes past this size (EFBIG), for the tests of a full volume.
		if limit, err := strconv.ParseUint(os.Getenv(envChildFileLimit), 10, 64); err == nil {
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: limit, Max: limit}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		err := Run(ctx, Options{ConfigPath: config, CredentialsDir: os.TempDir()})
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
