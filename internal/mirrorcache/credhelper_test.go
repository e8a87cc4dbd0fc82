package mirrorcache

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/docker/docker-credential-helpers/credentials"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

func TestHostAllowed(t *testing.T) {
	for _, tc := range []struct {
		upstream, host string
		want           bool
	}{
		{"https://registry-1.docker.io", "registry-1.docker.io", true},
		{"https://registry-1.docker.io", "auth.docker.io", true}, // Docker Hub's token service
		{"https://registry-1.docker.io", "AUTH.docker.io:443", true},
		{"https://ghcr.io", "ghcr.io", true},
		{"https://registry-1.docker.io", "docker.io.example.com", false},
		{"https://registry-1.docker.io", "example.com", false},
		{"https://quay.io", "", false},
		// A public suffix is no shared domain: two tenants of github.io are strangers.
		{"https://a.github.io", "b.github.io", false},
		{"https://example.co.uk", "evil.co.uk", false},
		{"https://registry.example.co.uk", "auth.example.co.uk", true},
		{"https://quay.io", "quay.io/evil", false},
		// Addresses and localhost must match host:port exactly.
		{"http://127.0.0.1:5000", "127.0.0.1:5000", true},
		{"http://127.0.0.1:5000", "127.0.0.1:5001", false},
		{"http://127.0.0.1:5000", "127.0.0.1", false},
		{"http://localhost:5000", "localhost:6000", false},
		{"http://[fd00::1]:5000", "[fd00::1]:5000", true},
		{"http://[fd00::1]:5000", "[fd00::2]:5000", false},
		{"http://registry.internal:5000", "evil.internal:5000", false}, // .internal is no registrable domain
	} {
		if got := hostAllowed(tc.upstream, tc.host); got != tc.want {
			t.Errorf("hostAllowed(%q, %q) = %v, want %v", tc.upstream, tc.host, got, tc.want)
		}
	}
}

// helperEnv sets what a cache sets for its helper and returns the credentials directory.
func helperEnv(t *testing.T, upstream string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o400); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(envCredentialsDir, dir)
	t.Setenv(envUpstream, upstream)
	return dir
}

func runHelper(t *testing.T, host string) (credentials.Credentials, string, error) {
	t.Helper()
	var out bytes.Buffer
	err := CredentialHelper(strings.NewReader(host), &out)
	var c credentials.Credentials
	if err == nil {
		if jerr := json.Unmarshal(out.Bytes(), &c); jerr != nil {
			t.Fatalf("the helper wrote %q: %v", out.String(), jerr)
		}
	}
	return c, out.String(), err
}

func TestCredentialHelper(t *testing.T) {
	t.Run("the upstream gets the files' credentials, line breaks trimmed", func(t *testing.T) {
		helperEnv(t, "https://registry-1.docker.io", map[string]string{mirror.UsernameKey: "alice\n", mirror.PasswordKey: "s3cret\r\n"})
		c, _, err := runHelper(t, "auth.docker.io\n")
		if err != nil {
			t.Fatal(err)
		}
		if c != (credentials.Credentials{ServerURL: "auth.docker.io", Username: "alice", Secret: "s3cret"}) {
			t.Errorf("credentials = %+v", c)
		}
	})
	t.Run("another host gets the protocol's not found, and no secret", func(t *testing.T) {
		helperEnv(t, "https://registry-1.docker.io", map[string]string{mirror.UsernameKey: "alice", mirror.PasswordKey: "s3cret"})
		_, out, err := runHelper(t, "evil.example.com")
		if err == nil || !credentials.IsErrCredentialsNotFoundMessage(out) {
			t.Fatalf("out %q, err %v; want the not-found message and an error", out, err)
		}
		if strings.Contains(out+err.Error(), "s3cret") || strings.Contains(out+err.Error(), "alice") {
			t.Errorf("the refusal leaks the credentials: %q, %v", out, err)
		}
	})
	t.Run("no files means anonymous: empty credentials, not an error", func(t *testing.T) {
		helperEnv(t, "https://quay.io", nil)
		c, _, err := runHelper(t, "quay.io")
		if err != nil || c.Username != "" || c.Secret != "" {
			t.Fatalf("credentials %+v, err %v; want empty ones", c, err)
		}
	})
	t.Run("a username without a password is an error", func(t *testing.T) {
		helperEnv(t, "https://quay.io", map[string]string{mirror.UsernameKey: "alice"})
		if _, out, err := runHelper(t, "quay.io"); err == nil {
			t.Fatalf("out %q, no error", out)
		}
	})
	t.Run("rotated files are read on the next run", func(t *testing.T) {
		dir := helperEnv(t, "https://quay.io", map[string]string{mirror.UsernameKey: "alice", mirror.PasswordKey: "old"})
		if err := os.Remove(filepath.Join(dir, mirror.PasswordKey)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, mirror.PasswordKey), []byte("new"), 0o400); err != nil {
			t.Fatal(err)
		}
		if c, _, err := runHelper(t, "quay.io"); err != nil || c.Secret != "new" {
			t.Fatalf("credentials %+v, err %v; want the new password", c, err)
		}
	})
	t.Run("outside a cache it refuses to run", func(t *testing.T) {
		t.Setenv(envCredentialsDir, "")
		if _, _, err := runHelper(t, "quay.io"); err == nil {
			t.Fatal("no error")
		}
		if HelperRequested([]string{HelperAction}) {
			t.Error("HelperRequested without the environment")
		}
	})
}
