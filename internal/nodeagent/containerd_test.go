package nodeagent

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// singleDirConfig is containerd 2's configuration as the mirror needs it: config_path one directory.
const singleDirConfig = "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '/etc/containerd/certs.d'\n"

// writeNode is writeNodeFiles with containerd's configuration singleDirConfig unless files has one.
func writeNode(t *testing.T, files map[string]string) string {
	t.Helper()
	all := map[string]string{configFile: singleDirConfig}
	maps.Copy(all, files)
	return writeNodeFiles(t, all)
}

// writeNodeFiles lays out node files (node path → content) under a new root and returns it.
func writeNodeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc", "containerd"), 0o755); err != nil {
		t.Fatal(err)
	}
	for path, content := range files {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const configFile = "/etc/containerd/config.toml"

func TestReadHostsConfig(t *testing.T) {
	for _, tc := range []struct {
		name       string
		files      map[string]string
		configPath string // "" = containerd reads no hosts.toml
		defaulted  bool
		localPull  bool
		ignored    bool // containerd 2 through its transfer service, and a list
		err        string
	}{
		{
			name:       "no config file: containerd 2 defaults",
			configPath: "/etc/containerd/certs.d:/etc/docker/certs.d", defaulted: true, ignored: true,
		},
		{
			name:       "containerd 2 (version 3) without registry settings",
			files:      map[string]string{configFile: "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_selinux = false\n"},
			configPath: "/etc/containerd/certs.d:/etc/docker/certs.d", defaulted: true, ignored: true,
		},
		{
			name:       "containerd 2 with a list of directories",
			files:      map[string]string{configFile: "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '/etc/containerd/certs.d:/etc/docker/certs.d'\n"},
			configPath: "/etc/containerd/certs.d:/etc/docker/certs.d", ignored: true,
		},
		{
			name:       "containerd 2 pulling locally reads the list",
			files:      map[string]string{configFile: "version = 3\n[plugins.'io.containerd.cri.v1.images']\n  use_local_image_pull = true\n"},
			configPath: "/etc/containerd/certs.d:/etc/docker/certs.d", defaulted: true, localPull: true,
		},
		{
			name: "use_local_image_pull in an import",
			files: map[string]string{
				configFile:                         "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n",
				"/etc/containerd/conf.d/pull.toml": "version = 3\n[plugins.'io.containerd.cri.v1.images']\n  use_local_image_pull = true\n",
			},
			configPath: "/etc/containerd/certs.d:/etc/docker/certs.d", defaulted: true, localPull: true,
		},
		{
			name:       "containerd 1 reads each directory of a list",
			files:      map[string]string{configFile: "version = 2\n[plugins.'io.containerd.grpc.v1.cri'.registry]\n  config_path = '/etc/containerd/certs.d:/etc/docker/certs.d'\n"},
			configPath: "/etc/containerd/certs.d:/etc/docker/certs.d",
		},
		{
			name:       "containerd 2 (version 3) with its own config_path",
			files:      map[string]string{configFile: "version = 3\n[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = \"/etc/containerd/registry.d\"\n"},
			configPath: "/etc/containerd/registry.d",
		},
		{
			name:       "containerd 2.2 (version 4) with its own config_path",
			files:      map[string]string{configFile: "version = 4\n[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = '/etc/containerd/certs.d'\n"},
			configPath: "/etc/containerd/certs.d",
		},
		{
			name: "containerd 2 with deprecated mirrors and no config_path: no default",
			files: map[string]string{configFile: "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry.mirrors.'docker.io']\n" +
				"  endpoint = ['https://mirror.example']\n"},
		},
		{
			name:       "containerd 1 (version 2) with config_path",
			files:      map[string]string{configFile: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n"},
			configPath: "/etc/containerd/certs.d",
		},
		{
			name: "containerd 1 (version 2) without config_path",
			files: map[string]string{configFile: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.9\"\n" +
				"[plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"docker.io\"]\n  endpoint = [\"https://registry-1.docker.io\"]\n"},
		},
		{
			name:       "containerd 1 version 1 file: the CRI plugin under its short name",
			files:      map[string]string{configFile: "[plugins.cri.registry]\n  config_path = \"/etc/containerd/certs.d\"\n"},
			configPath: "/etc/containerd/certs.d",
		},
		{
			name:  "containerd 1 version 1 file ignores the full plugin name",
			files: map[string]string{configFile: "[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n"},
		},
		{
			name:  "an empty file is containerd 1's defaults",
			files: map[string]string{configFile: ""},
		},
		{
			name: "containerd 2: an import replaces the images plugin's table",
			files: map[string]string{
				configFile:                      "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '/etc/containerd/certs.d'\n",
				"/etc/containerd/conf.d/a.toml": "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '/etc/containerd/other.d'\n",
			},
			configPath: "/etc/containerd/other.d",
		},
		{
			name: "containerd 2: an imported version 2 file's CRI registry moves to the images plugin",
			files: map[string]string{
				configFile:                        "version = 3\nimports = ['conf.d/old.toml']\n",
				"/etc/containerd/conf.d/old.toml": "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/legacy.d\"\n",
			},
			configPath: "/etc/containerd/legacy.d",
		},
		{
			name: "containerd 1: config_path from an import",
			files: map[string]string{
				configFile:                      "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n",
				"/etc/containerd/conf.d/r.toml": "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n",
			},
			configPath: "/etc/containerd/certs.d",
		},
		{
			name:  "an import that does not exist stops containerd too",
			files: map[string]string{configFile: "version = 3\nimports = ['/etc/containerd/missing.toml']\n"},
			err:   "missing.toml",
		},
		{
			name:  "not TOML",
			files: map[string]string{configFile: "version = = 3\n"},
			err:   "parsing containerd's configuration",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := writeNodeFiles(t, tc.files)
			hc, err := ReadHostsConfig(root, configFile)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error about %q", hc, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if hc.ConfigPath != tc.configPath || hc.Defaulted != tc.defaulted {
				t.Errorf("config_path %q (defaulted %v), want %q (defaulted %v)", hc.ConfigPath, hc.Defaulted, tc.configPath, tc.defaulted)
			}
			if hc.LocalPull != tc.localPull || hc.Ignored() != tc.ignored {
				t.Errorf("local pull %v, ignored %v; want %v, %v", hc.LocalPull, hc.Ignored(), tc.localPull, tc.ignored)
			}
			if want := strings.Split(tc.configPath, ":")[0]; hc.Dir() != want {
				t.Errorf("Dir() = %q, want %q", hc.Dir(), want)
			}
		})
	}
}

// Paths in containerd's configuration cannot lead the agent outside the node's root.
func TestNodePathStaysUnderRoot(t *testing.T) {
	for p, want := range map[string]string{
		"/etc/containerd/certs.d": "/host/etc/containerd/certs.d",
		"../../etc/passwd":        "/host/etc/passwd",
		"/../../etc":              "/host/etc",
		"etc/containerd":          "/host/etc/containerd",
	} {
		if got := nodePath("/host", p); got != want {
			t.Errorf("nodePath(/host, %q) = %q, want %q", p, got, want)
		}
	}
}
