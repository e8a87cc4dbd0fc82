// Package kubeconfig renders a kubeconfig file that authenticates with a bearer token.
package kubeconfig

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
)

// Params describe a token-authenticated kubeconfig with one cluster, user and context.
type Params struct {
	// Name names the cluster, user and context entries.
	Name string
	// Server is the API server URL.
	Server string
	// CAData is the PEM bundle that verifies the server; empty means the system roots.
	CAData []byte
	// Token is the bearer token.
	Token string
	// Namespace is the context's default namespace; optional.
	Namespace string
}

// Render returns the kubeconfig as YAML, laid out as clientcmd.Write lays it out. It is written
// directly: clientcmd.Write goes through JSON, a YAML parse of that JSON and a YAML encoding, about
// 80 KB of garbage per kubeconfig, which for a burst of namespace requests was a seventh of all the
// manager allocated.
func Render(p Params) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(512 + len(p.Server) + base64.StdEncoding.EncodedLen(len(p.CAData)) + len(p.Token) + 8*len(p.Name) + len(p.Namespace))
	b.WriteString("apiVersion: v1\nclusters:\n- cluster:\n")
	if len(p.CAData) > 0 {
		b.WriteString("    certificate-authority-data: ")
		b.WriteString(base64.StdEncoding.EncodeToString(p.CAData))
		b.WriteByte('\n')
	}
	field(&b, "    server: ", p.Server)
	field(&b, "  name: ", p.Name)
	b.WriteString("contexts:\n- context:\n")
	field(&b, "    cluster: ", p.Name)
	if p.Namespace != "" {
		field(&b, "    namespace: ", p.Namespace)
	}
	field(&b, "    user: ", p.Name)
	field(&b, "  name: ", p.Name)
	field(&b, "current-context: ", p.Name)
	b.WriteString("kind: Config\nusers:\n")
	field(&b, "- name: ", p.Name)
	b.WriteString("  user:\n")
	field(&b, "    token: ", p.Token)
	return b.Bytes(), nil
}

// field writes one "key: value" line, the value as a plain YAML scalar when it can only read as
// the string it is, else double-quoted (JSON's quoting, which YAML reads).
func field(b *bytes.Buffer, key, value string) {
	b.WriteString(key)
	if plain(value) {
		b.WriteString(value)
	} else {
		q, _ := json.Marshal(value) // a string always marshals
		b.Write(q)
	}
	b.WriteByte('\n')
}

// plain reports whether s can be written unquoted: it starts with a letter, holds only characters
// of URLs, DNS names, tokens and base64, has no ": " or " #" (it has no spaces at all) and does not
// end in ":", and is not a word YAML reads as a boolean or null.
func plain(s string) bool {
	if s == "" || !isLetter(s[0]) || strings.HasSuffix(s, ":") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isLetter(c) && !isDigit(c) && !strings.ContainsRune("-._~:/?#[]@!$&()*+,;=%", rune(c)) {
			return false
		}
	}
	// The first character of an indicator (!, &, *, ...) is excluded by the letter rule; what is
	// left is YAML 1.1's word values.
	switch strings.ToLower(s) {
	case "y", "yes", "n", "no", "true", "false", "on", "off", "null":
		return false
	}
	return true
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// Server returns the API server URL of a kubeconfig's current context. A kubeconfig as Render
// writes it is read by its layout (and rendered again to make sure it is one); any other is
// parsed, which costs ten times as much.
func Server(data []byte) (string, error) {
	if p, ok := parseRendered(data); ok {
		return p.Server, nil
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return "", err
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return "", fmt.Errorf("kubeconfig has no current context")
	}
	cluster, ok := cfg.Clusters[ctx.Cluster]
	if !ok {
		return "", fmt.Errorf("kubeconfig has no cluster %q", ctx.Cluster)
	}
	return cluster.Server, nil
}

// parseRendered reads the parameters of a kubeconfig Render wrote, and whether it is one: the
// values are taken from their lines, and the kubeconfig rendered from them must be data itself.
func parseRendered(data []byte) (Params, bool) {
	var p Params
	var ca string
	fields := []struct {
		prefix string
		value  *string
	}{
		{"    certificate-authority-data: ", &ca}, {"    server: ", &p.Server}, {"  name: ", &p.Name},
		{"    namespace: ", &p.Namespace}, {"    token: ", &p.Token},
	}
	for line := range bytes.Lines(data) {
		line = bytes.TrimSuffix(line, []byte("\n"))
		for _, f := range fields {
			v, ok := bytes.CutPrefix(line, []byte(f.prefix))
			if !ok || *f.value != "" {
				continue // the first line of each wins (a context's name repeats its cluster's)
			}
			if len(v) > 0 && v[0] == '"' {
				if json.Unmarshal(v, f.value) != nil {
					return p, false
				}
			} else {
				*f.value = string(v)
			}
		}
	}
	if ca != "" {
		var err error
		if p.CAData, err = base64.StdEncoding.DecodeString(ca); err != nil {
			return p, false
		}
	}
	again, err := Render(p)
	return p, err == nil && bytes.Equal(again, data)
}

// Published returns the API server URL and CA of the kubeconfig a cluster publishes in
// kube-public/cluster-info (as kubeadm does): one cluster entry, no context or user.
func Published(data []byte) (server string, ca []byte, err error) {
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return "", nil, err
	}
	if len(cfg.Clusters) != 1 {
		return "", nil, fmt.Errorf("want one cluster, found %d", len(cfg.Clusters))
	}
	for _, c := range cfg.Clusters {
		server, ca = c.Server, c.CertificateAuthorityData
	}
	if server == "" {
		return "", nil, fmt.Errorf("the cluster has no server")
	}
	return server, ca, nil
}
