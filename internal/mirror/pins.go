package mirror

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
)

// Pinning by use: the images the cluster's workloads reference through a mirror's host are kept
// by its cache whatever their ttl (never expired, never evicted), and for ttl after the last
// reference goes. The controller writes them into one ConfigMap per mirror (PinsConfigMap), which
// every cache pod of the mirror mounts at PinsDir and reads again when the kubelet updates it: the
// pods agree on what is pinned, and a pin survives a restart of the manager or of a cache pod.
const (
	// PinsDir is where a cache pod mounts its mirror's pins ConfigMap (optional: a cache without
	// one pins nothing); PinsFile is its one key.
	PinsDir  = "/etc/quartermaster/mirror-pins"
	PinsFile = "pins.json"
)

// PinsName names a mirror's pins ConfigMap.
func PinsName(mirror string) string { return CacheName(mirror) + "-pins" }

// Pins are a mirror's pinned images: each reference (a repository of the mirror's upstream and a
// tag or digest, as PinRef makes it) maps to "" while a workload references it, or to the time
// (RFC 3339) until which it stays pinned after the last reference went. Platforms are the
// cluster's nodes' platforms ("linux/amd64", sorted): of a pinned multi-platform image the cache
// fetches the manifest of each (none listed: the cache pod's own).
type Pins struct {
	Images    map[string]string `json:"images"`
	Platforms []string          `json:"platforms,omitempty"`
}

// platformPart is an OS or architecture name as nodes label them (kubernetes.io/os, kubernetes.io/arch).
var platformPart = regexp.MustCompile(`^[a-z0-9]+$`)

// Platform is the platform of a node labelled os and arch ("linux/amd64"), or "" when either is
// not a platform name.
func Platform(os, arch string) string {
	if !platformPart.MatchString(os) || !platformPart.MatchString(arch) {
		return ""
	}
	return os + "/" + arch
}

// Refs are the pinned references, sorted.
func (p Pins) Refs() []string { return slices.Sorted(maps.Keys(p.Images)) }

// ParsePins reads a pins file; every reference must be one PinRef could have made.
func ParsePins(b []byte) (Pins, error) {
	var p Pins
	if err := json.Unmarshal(b, &p); err != nil {
		return Pins{}, fmt.Errorf("%s: %w", PinsFile, err)
	}
	for _, pl := range p.Platforms {
		if os, arch, _ := strings.Cut(pl, "/"); Platform(os, arch) != pl {
			return Pins{}, fmt.Errorf("%s: platform %q is not os/arch", PinsFile, pl)
		}
	}
	for ref, until := range p.Images {
		if _, _, _, err := SplitPin(ref); err != nil {
			return Pins{}, err
		}
		if until != "" {
			if _, err := time.Parse(time.RFC3339, until); err != nil {
				return Pins{}, fmt.Errorf("%s: pin %q: until %q is not an RFC 3339 time", PinsFile, ref, until)
			}
		}
	}
	return p, nil
}

// PinsConfigMap is the ConfigMap the mirror's cache pods read their pins from.
func PinsConfigMap(in Install, s Spec, p Pins) (*corev1.ConfigMap, error) {
	if p.Images == nil {
		p.Images = map[string]string{}
	}
	b, err := json.Marshal(p) // map keys sorted: the same pins are the same bytes
	if err != nil {
		return nil, err
	}
	return &corev1.ConfigMap{
		ObjectMeta: objectMeta(in, PinsName(s.Name), s.Name, ComponentCache),
		Data:       map[string]string{PinsFile: string(b)},
	}, nil
}

// PinRef is the pin of an image reference a workload names, if it is pulled through the mirror of
// host: its repository and its digest ("library/nginx@sha256:…") or, without one, its tag
// ("library/nginx:1.27"; "latest" when it names none). ok is false for an image of another
// registry, and for one that does not parse (the kubelet would not pull it either).
func PinRef(image, host string) (ref string, ok bool) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil || !strings.EqualFold(reference.Domain(named), host) {
		return "", false
	}
	path := reference.Path(named)
	if d, isDigested := named.(reference.Digested); isDigested {
		return path + "@" + d.Digest().String(), true
	}
	tag := "latest"
	if t, isTagged := named.(reference.Tagged); isTagged {
		tag = t.Tag()
	}
	return path + ":" + tag, true
}

// ImageHost is the registry host an image reference is pulled from ("docker.io" for "nginx"), as
// the kubelet resolves it; "" when it does not parse.
func ImageHost(image string) string {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return ""
	}
	return strings.ToLower(reference.Domain(named))
}

// SplitPin splits a pin into its repository and its tag or digest (one of them empty).
func SplitPin(ref string) (repo, tag, dig string, err error) {
	if i := strings.LastIndexByte(ref, '@'); i > 0 {
		repo, dig = ref[:i], ref[i+1:]
	} else if i := strings.LastIndexByte(ref, ':'); i > 0 && !strings.Contains(ref[i:], "/") {
		repo, tag = ref[:i], ref[i+1:]
	}
	if repo == "" || (tag == "" && dig == "") {
		return "", "", "", fmt.Errorf("pin %q is not repository:tag or repository@digest", ref)
	}
	if _, perr := reference.ParseNamed("pin.invalid/" + ref); perr != nil {
		return "", "", "", fmt.Errorf("pin %q: %w", ref, perr)
	}
	return repo, tag, dig, nil
}
