package nodeagent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// DefaultContainerdConfig is where containerd reads its configuration on a node.
const DefaultContainerdConfig = "/etc/containerd/config.toml"

// containerd2DefaultConfigPath is containerd 2's registry config_path when its configuration sets
// none (plugins/cri/images/plugin.go, on Linux, unless deprecated mirrors are set).
const containerd2DefaultConfigPath = "/etc/containerd/certs.d:/etc/docker/certs.d"

// The CRI plugin tables that hold the registry settings. containerd 2 (config version 3 and
// later) has them in the images plugin; containerd 1 (version 2) in the CRI plugin under its full
// name, and version 1 files under its short name.
const (
	imagesPlugin  = "io.containerd.cri.v1.images"
	criPlugin     = "io.containerd.grpc.v1.cri"
	criPluginV1ID = "cri"
)

// HostsConfig is where a node's containerd reads hosts.toml files from, as its configuration
// says.
type HostsConfig struct {
	// ConfigPath is the effective registry config_path, node paths separated by ':'; empty when
	// containerd reads no hosts.toml (containerd 1 without config_path).
	ConfigPath string
	// Defaulted is true when ConfigPath is containerd 2's default rather than set in a file.
	Defaulted bool
	// Version is the main file's config version (0 when it has none, or there is no file).
	Version int
	// Containerd2: the configuration is containerd 2's (version 3 or later, or no file).
	Containerd2 bool
	// LocalPull: containerd 2's CRI pulls with its own resolver (use_local_image_pull = true),
	// as containerd 1 always does, instead of through the transfer service.
	LocalPull bool
}

// OneDirOnly reports whether containerd reads ConfigPath as a single directory: containerd 2's
// CRI pulls through the transfer service, which joins the whole config_path with the host name
// (core/transfer/registry: HostDirFromRoot(config_path)), while its local pull and containerd 1
// split the list. A list there makes every pull ignore every hosts.toml.
func (h HostsConfig) OneDirOnly() bool { return h.Containerd2 && !h.LocalPull }

// Ignored reports whether containerd ignores the hosts directories of ConfigPath altogether: a
// list (containerd 2's default is one) where it reads one directory only.
func (h HostsConfig) Ignored() bool {
	return h.OneDirOnly() && strings.ContainsRune(h.ConfigPath, filepath.ListSeparator)
}

// Dir is the directory the agent writes into: the first of ConfigPath, the one containerd looks
// in first. Empty when containerd reads none.
func (h HostsConfig) Dir() string {
	for _, d := range filepath.SplitList(h.ConfigPath) {
		if d != "" {
			return d
		}
	}
	return ""
}

// containerdFile is the part of a containerd config file that says where hosts.toml files are.
type containerdFile struct {
	Version int                       `toml:"version"`
	Imports []string                  `toml:"imports"`
	Plugins map[string]registryPlugin `toml:"plugins"`
}

type registryPlugin struct {
	Registry          *registry `toml:"registry"`
	UseLocalImagePull bool      `toml:"use_local_image_pull"`
}

type registry struct {
	ConfigPath string         `toml:"config_path"`
	Mirrors    map[string]any `toml:"mirrors"`
}

// ReadHostsConfig reads containerd's configuration at configFile (a node path) under root and
// its imports, the way containerd merges them: each plugin's table in a later file replaces the
// earlier one. A missing main file means containerd 2's defaults.
//
// The main file's version says which containerd reads it: 3 and later is containerd 2, which
// moves older files' CRI registry table into its images plugin; 2, 1 or none is taken to be
// containerd 1 (containerd 2 would migrate such a file and default config_path, which a version 2
// file cannot tell).
func ReadHostsConfig(root, configFile string) (HostsConfig, error) {
	var (
		out     HostsConfig
		files   []containerdFile
		pending = []string{configFile}
		loaded  = map[string]bool{}
	)
	for len(pending) > 0 {
		path := pending[0]
		pending = pending[1:]
		if loaded[path] {
			continue
		}
		data, err := os.ReadFile(nodePath(root, path))
		if errors.Is(err, fs.ErrNotExist) && path == configFile {
			out.ConfigPath, out.Defaulted, out.Containerd2 = containerd2DefaultConfigPath, true, true
			return out, nil
		}
		if err != nil {
			return HostsConfig{}, fmt.Errorf("reading containerd's configuration: %w", err)
		}
		var f containerdFile
		if err := toml.Unmarshal(data, &f); err != nil {
			return HostsConfig{}, fmt.Errorf("parsing containerd's configuration %s: %w", path, err)
		}
		loaded[path] = true
		files = append(files, f)
		imports, err := resolveImports(root, path, f.Imports)
		if err != nil {
			return HostsConfig{}, err
		}
		pending = append(pending, imports...)
	}
	out.Version = files[0].Version
	if out.Version >= 3 {
		out.Containerd2 = true
		images := containerd2Images(files)
		var reg *registry
		if images != nil {
			reg, out.LocalPull = images.Registry, images.UseLocalImagePull
		}
		if reg == nil || (reg.ConfigPath == "" && len(reg.Mirrors) == 0) {
			out.ConfigPath, out.Defaulted = containerd2DefaultConfigPath, true
		} else {
			out.ConfigPath = reg.ConfigPath
		}
		return out, nil
	}
	if reg := containerd1Registry(files); reg != nil {
		out.ConfigPath = reg.ConfigPath
	}
	return out, nil
}

// containerd2Images is the images plugin's table after containerd 2's migration of older files
// and its merge; nil when no file has one.
func containerd2Images(files []containerdFile) *registryPlugin {
	var images *registryPlugin
	for _, f := range files {
		table, ok := f.Plugins[imagesPlugin]
		if f.Version < 3 {
			// containerd 2 renames version 1's short plugin names, then copies the CRI
			// plugin's registry table into the images plugin.
			old, hasOld := f.Plugins[criPlugin]
			if v1, ok := f.Plugins[criPluginV1ID]; f.Version <= 1 && ok {
				old, hasOld = v1, true
			}
			if hasOld {
				if old.Registry != nil {
					table.Registry = old.Registry
				}
				ok = true
			}
		}
		if ok {
			images = &table
		}
	}
	return images
}

// containerd1Registry is the CRI plugin's registry table after containerd 1's merge, where the
// last version set in any file decides the plugin's name.
func containerd1Registry(files []containerdFile) *registry {
	version := 0
	for _, f := range files {
		if f.Version != 0 {
			version = f.Version
		}
	}
	name := criPlugin
	if version <= 1 {
		name = criPluginV1ID
	}
	var cri *registryPlugin
	for _, f := range files {
		if table, ok := f.Plugins[name]; ok {
			cri = &table
		}
	}
	if cri == nil {
		return nil
	}
	return cri.Registry
}

// resolveImports lists the node paths an imports list names, as containerd does: relative to the
// importing file's directory, globs expanded.
func resolveImports(root, parent string, imports []string) ([]string, error) {
	var out []string
	for _, imp := range imports {
		p := filepath.Clean(imp)
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(parent), p)
		}
		if !strings.Contains(p, "*") {
			out = append(out, p)
			continue
		}
		// Globbed inside root, so that nothing in root's own name is taken for a pattern.
		matches, err := fs.Glob(os.DirFS(root), strings.TrimPrefix(p, "/"))
		if err != nil {
			return nil, fmt.Errorf("containerd's imports %q: %w", imp, err)
		}
		for _, m := range matches {
			out = append(out, "/"+m)
		}
	}
	return out, nil
}

// nodePath is where the agent sees the node's path p: under root, never above it.
func nodePath(root, p string) string {
	return filepath.Join(root, filepath.Clean("/"+p))
}
