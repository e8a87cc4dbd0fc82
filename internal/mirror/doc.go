// Package mirror is the pure part of the registry mirrors: the defaults and names of a
// RegistryMirror's objects, the objects themselves, the pull-through cache's configuration and the
// containerd hosts.toml the node agent writes. Nothing here talks to a server.
package mirror
