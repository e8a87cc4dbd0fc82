// Package memlimit gives Go's collector the container's memory limit as a soft limit, so a manager
// whose cache has grown near its limit collects harder instead of being OOM-killed. Go reads
// GOMEMLIMIT but, unlike GOMAXPROCS since Go 1.25, does not look at the cgroup by itself.
package memlimit

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// Ratio of the cgroup's limit given to the collector: the rest is for what the Go heap does not
// count (stacks, the binary's pages, memory not yet returned to the kernel).
const Ratio = 0.9

// cgroupFiles are where a container sees its own memory limit: cgroup v2, then v1.
var cgroupFiles = []string{"memory.max", "memory/memory.limit_in_bytes"}

// unlimitedV1 is above any real limit: cgroup v1 reports "no limit" as a page-rounded MaxInt64.
const unlimitedV1 = 1 << 62

// FromCgroup sets the soft memory limit to Ratio of the memory limit of the cgroup mounted at root
// (/sys/fs/cgroup in a container) and returns it with the file it came from. It changes nothing
// and returns 0 when GOMEMLIMIT is set (the operator chose) or no limit is found (not in a
// container, or no limit set); an unreadable or malformed file is an error.
func FromCgroup(root string) (int64, string, error) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, "", nil
	}
	for _, name := range cgroupFiles {
		path := filepath.Join(root, name)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, "", err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, "", nil
		}
		limit, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, "", fmt.Errorf("%s: %w", path, err)
		}
		if limit <= 0 || limit >= unlimitedV1 {
			return 0, "", nil
		}
		soft := int64(math.Floor(float64(limit) * Ratio))
		debug.SetMemoryLimit(soft)
		return soft, path, nil
	}
	return 0, "", nil
}
