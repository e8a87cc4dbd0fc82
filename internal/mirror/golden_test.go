package mirror

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// golden compares got with the file at path (under testdata), or writes it there with -update.
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	path = filepath.Join("testdata", path)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/mirror -run %s -update, and review the diff)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what is rendered now (rerun with -update and review the diff):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}
