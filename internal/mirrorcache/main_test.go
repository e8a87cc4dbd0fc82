package mirrorcache

import (
	"fmt"
	"os"
	"testing"
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
	os.Exit(m.Run())
}
