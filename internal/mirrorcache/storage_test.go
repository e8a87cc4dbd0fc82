package mirrorcache

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestPrepareStorage: the init container's rule on volumes as provisioners leave them. Run as root
// (CI is), it really changes owners.
func TestPrepareStorage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a directory's owner needs root")
	}
	cache := Owner{UID: 65532, GID: 65532}
	for name, tc := range map[string]struct {
		mode      os.FileMode
		uid, gid  int
		files     []string
		wantOwner int    // the directory's owner afterwards
		wantErr   string // part of the refusal
		wantDone  bool   // something was done
	}{
		"hostPath provisioner: root 0750, empty": {mode: 0o750, wantOwner: 65532, wantDone: true},
		"root 0755 with lost+found":              {mode: 0o755, files: []string{"lost+found"}, wantOwner: 65532, wantDone: true},
		"fsGroup applied: group-writable":        {mode: 0o2770, gid: 65532, wantOwner: 0},
		"prepared before":                        {mode: 0o750, uid: 65532, gid: 65532, wantOwner: 65532},
		"world-writable":                         {mode: 0o777, wantOwner: 0},
		"root's data": {mode: 0o750, files: []string{"index.json"}, wantOwner: 0,
			wantErr: "not writable by uid 65532 (gid 65532): it is owned by 0:0, mode 0750; it already holds index.json"},
		"someone else's": {mode: 0o750, uid: 1000, gid: 1000, wantOwner: 1000,
			wantErr: "it is owned by uid 1000, not root"},
		"owner has no write": {mode: 0o550, wantOwner: 0, wantErr: "gives even its owner no write"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "volume")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chown(dir, tc.uid, tc.gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.mode); err != nil {
				t.Fatal(err)
			}
			done, err := PrepareStorage(dir, cache)
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("want a refusal saying %q, got %v", tc.wantErr, err)
			case tc.wantErr == "" && err != nil:
				t.Errorf("want no error, got %v", err)
			case (done != "") != tc.wantDone:
				t.Errorf("done: %q, want something done: %v", done, tc.wantDone)
			}
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != tc.wantOwner {
				t.Errorf("owner afterwards %d, want %d", uid, tc.wantOwner)
			}
		})
	}
}

// TestCheckStorage: the cache's own check names the owner and mode of a volume it cannot write.
// As root (CI) the refusal is checked in a child process run as the cache's user.
func TestCheckStorage(t *testing.T) {
	if dir := os.Getenv("QM_CHECK_STORAGE_DIR"); dir != "" {
		// The child: report CheckStorage's answer.
		if err := CheckStorage(dir); err != nil {
			fmt.Print(err)
		}
		return
	}
	dir := t.TempDir()
	if err := CheckStorage(dir); err != nil {
		t.Fatalf("a writable directory: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the check left %v behind", entries)
	}

	// A volume as the hostPath provisioner leaves it: root's, 0750.
	vol, err := os.MkdirTemp("", "qm-check-storage")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(vol) })
	if err := os.Chmod(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(vol, "test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	storage := filepath.Join(vol, "storage")
	if err := os.Mkdir(storage, 0o750); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestCheckStorage$")
	cmd.Env = append(os.Environ(), "QM_CHECK_STORAGE_DIR="+storage)
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
	} else if err := os.Chmod(storage, 0o500); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the check as the cache's user: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "is not writable by uid") || !strings.Contains(string(out), "mode 0750") &&
		!strings.Contains(string(out), "mode 0500") {
		t.Errorf("want a refusal naming the owner and mode, got %s", out)
	}
}
