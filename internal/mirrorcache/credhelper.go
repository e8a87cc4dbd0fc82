package mirrorcache

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/docker/docker-credential-helpers/credentials"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// The cache is its own credential helper. distribution's proxy.exec runs a program speaking the
// docker-credential-helpers protocol ("<command> get", server host on stdin, credentials as JSON
// on stdout), and a proxy configured that way never pings the upstream at start (the ping that
// panics when the upstream is down, distribution issue #4038): challenges are fetched on the
// first request that needs the upstream, and again on the next one if that failed.
//
// The command is the running executable itself (os.Executable), so an image holding only the
// binary works: no shell, no second program. distribution passes no arguments but the action and
// no environment but its own, so the cache sets these variables in its own environment; their
// presence is what makes "<binary> get" the helper and not the program's usual command.
const (
	envCredentialsDir = "QUARTERMASTER_MIRROR_CREDENTIALS_DIR"
	envUpstream       = "QUARTERMASTER_MIRROR_UPSTREAM"
)

// HelperAction is the only argument distribution passes to the credential helper.
const HelperAction = credentials.ActionGet

// HelperRequested reports whether this process was started by a cache as its credential helper
// (args are the process's arguments after the program name).
func HelperRequested(args []string) bool {
	return len(args) == 1 && args[0] == HelperAction && os.Getenv(envCredentialsDir) != ""
}

// CredentialHelper answers distribution's "get": it reads the server host from stdin and writes
// the upstream's credentials, read fresh from the credentials directory (a rotated Secret is
// picked up), to stdout. It answers only for the upstream's host and its token service; any other
// host gets the protocol's "not found", which distribution treats as anonymous. Without
// credentials files the answer is empty credentials: anonymous, and cached by distribution like
// real ones, so an anonymous upstream does not run the helper on every token request.
func CredentialHelper(stdin io.Reader, stdout io.Writer) error {
	dir, upstream := os.Getenv(envCredentialsDir), os.Getenv(envUpstream)
	if dir == "" || upstream == "" {
		return fmt.Errorf("%s is the registry mirror cache's credential helper: only the cache runs it (%s and %s unset)",
			HelperAction, envCredentialsDir, envUpstream)
	}
	host, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	host = strings.TrimSpace(host)
	if !hostAllowed(upstream, host) {
		fmt.Fprintln(stdout, credentials.NewErrCredentialsNotFound().Error())
		return fmt.Errorf("no credentials for %q: the cache gives them only to its upstream %s and its token service", host, upstream)
	}
	username, password, err := readCredentials(dir)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(credentials.Credentials{ServerURL: host, Username: username, Secret: password})
}

// readCredentials reads the username and password files; neither present means anonymous.
func readCredentials(dir string) (username, password string, err error) {
	u, uerr := os.ReadFile(filepath.Join(dir, mirror.UsernameKey))
	p, perr := os.ReadFile(filepath.Join(dir, mirror.PasswordKey))
	switch {
	case errors.Is(uerr, fs.ErrNotExist) && errors.Is(perr, fs.ErrNotExist):
		return "", "", nil
	case uerr != nil:
		return "", "", fmt.Errorf("upstream credentials: %w", uerr)
	case perr != nil:
		return "", "", fmt.Errorf("upstream credentials: %w", perr)
	}
	// A file made with kubectl create secret --from-file often ends with a line break.
	return strings.TrimRight(string(u), "\r\n"), strings.TrimRight(string(p), "\r\n"), nil
}

// hostAllowed reports whether host (host[:port], as distribution passes it) may receive the
// upstream's credentials, by the one rule of mirror.CredentialsAllowed. distribution gives the
// helper the host alone, so the host is taken as reached over https: the helper checks whom
// credentials go to, not how.
func hostAllowed(upstream, host string) bool {
	if host == "" || strings.ContainsAny(host, "/?#@") {
		return false
	}
	return mirror.CredentialsAllowed(upstream, &url.URL{Scheme: "https", Host: host})
}
