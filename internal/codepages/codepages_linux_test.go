package codepages

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadOnlyMappingsOfTheBinary(t *testing.T) {
	maps := filepath.Join(t.TempDir(), "maps")
	content := `00400000-0292c000 r-xp 00000000 fd:00 4242                         /usr/local/bin/quartermaster
0292c000-0532e000 r--p 0252c000 fd:00 4242                         /usr/local/bin/quartermaster
0532e000-05417000 rw-p 04f2e000 fd:00 4242                         /usr/local/bin/quartermaster
05417000-0746e000 rw-p 00000000 00:00 0
c000000000-c000400000 rw-p 00000000 00:00 0
7f4c89e68000-7f4c89fbe000 r-xp 00028000 fd:00 99                   /usr/lib/x86_64-linux-gnu/libc.so.6
`
	if err := os.WriteFile(maps, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	want := []mapping{{0x400000, 0x292c000}, {0x292c000, 0x532e000}}
	for _, by := range []struct {
		ino  uint64
		path string
	}{{4242, ""}, {1, "/usr/local/bin/quartermaster"}} {
		got, err := readOnlyMappings(maps, by.ino, by.path)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("by %+v: mappings %x, want the code and read-only data only: %x", by, got, want)
		}
	}
}

// Release runs on this test binary: every advice is accepted, the process goes on running its
// code (read back as needed), and nothing is left mapped that was not before.
func TestReleaseOnThisProcess(t *testing.T) {
	r, err := Release()
	if err != nil {
		t.Fatal(err)
	}
	if r.Ranges < 2 {
		t.Errorf("advised %d mappings, want the binary's code and read-only data", r.Ranges)
	}
	if r.FileBefore <= 0 || r.FileAfter > r.FileBefore {
		t.Errorf("resident file bytes %d before, %d after", r.FileBefore, r.FileAfter)
	}
	// Code and data paged out are read back: the test's own machinery keeps working.
	if _, err := Release(); err != nil {
		t.Fatal(err)
	}
}
