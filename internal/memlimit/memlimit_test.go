package memlimit

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestFromCgroup(t *testing.T) {
	t.Cleanup(func() { debug.SetMemoryLimit(math.MaxInt64) })
	cases := []struct {
		name     string
		files    map[string]string
		gomem    string
		want     int64
		wantFrom string
		wantErr  bool
	}{
		{name: "cgroup v2 limit", files: map[string]string{"memory.max": "268435456\n"}, want: 241591910, wantFrom: "memory.max"},
		{name: "cgroup v2 without a limit", files: map[string]string{"memory.max": "max\n"}},
		{name: "cgroup v1 limit", files: map[string]string{"memory/memory.limit_in_bytes": "536870912\n"}, want: 483183820, wantFrom: "memory/memory.limit_in_bytes"},
		{name: "cgroup v1 without a limit", files: map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}},
		{name: "no cgroup files", files: map[string]string{}},
		{name: "GOMEMLIMIT set wins", files: map[string]string{"memory.max": "268435456\n"}, gomem: "100MiB"},
		{name: "malformed file", files: map[string]string{"memory.max": "lots\n"}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tc.files {
				path := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv("GOMEMLIMIT", tc.gomem)
			debug.SetMemoryLimit(math.MaxInt64)
			got, from, err := FromCgroup(root)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("limit = %d, want %d", got, tc.want)
			}
			if tc.wantFrom != "" && from != filepath.Join(root, tc.wantFrom) {
				t.Errorf("from = %s, want %s", from, tc.wantFrom)
			}
			wantRuntime := tc.want
			if wantRuntime == 0 {
				wantRuntime = math.MaxInt64
			}
			if now := debug.SetMemoryLimit(-1); now != wantRuntime {
				t.Errorf("runtime's soft limit = %d, want %d", now, wantRuntime)
			}
		})
	}
}

func TestSetGCPercent(t *testing.T) {
	before := debug.SetGCPercent(-1)
	debug.SetGCPercent(before)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	t.Setenv("GOGC", "")
	if got := SetGCPercent(); got != GCPercent || debug.SetGCPercent(GCPercent) != GCPercent {
		t.Errorf("without GOGC: %d in force, want %d", got, GCPercent)
	}
	// With GOGC set, what the runtime took from it stays (here: whatever is in force).
	debug.SetGCPercent(80)
	t.Setenv("GOGC", "80")
	if got := SetGCPercent(); got != 80 || debug.SetGCPercent(80) != 80 {
		t.Errorf("with GOGC=80: %d in force, want 80", got)
	}
}
