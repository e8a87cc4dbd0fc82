package mirror

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
)

// Defaults of a RegistryMirror's optional fields. The CRD declares the same ones, so objects
// written through the API server already carry them; these cover objects that did not go through
// it (older stored versions, tests).
const (
	DefaultReplicas = 2
	DefaultTTL      = 168 * time.Hour
	// DefaultHighWater and DefaultLowWater are the cache volume's eviction marks, in percent
	// used; an unset low-water mark is ten points below the high one.
	DefaultHighWater = 85
	DefaultLowWater  = DefaultHighWater - 10
)

// DefaultStorageSize is each cache pod's volume when spec.storage.size is unset.
var DefaultStorageSize = resource.MustParse("20Gi")

// Spec is a RegistryMirror's spec with every default applied and the upstream normalized: what
// the objects are rendered from.
type Spec struct {
	Name string
	// UpstreamURL is scheme://host[:port] with no trailing slash.
	UpstreamURL string
	// MirrorHost is the host name nodes redirect to the mirror.
	MirrorHost        string
	CredentialsSecret string
	Replicas          int32
	StorageSize       resource.Quantity
	StorageClassName  *string
	TTL               time.Duration
	// HighWater and LowWater are the volume's eviction marks, in percent used.
	HighWater, LowWater int32
	// Prefetch are the images pinned and warmed whatever the workloads name (spec.prefetch).
	Prefetch       []string
	ServiceType    corev1.ServiceType
	NodeSelector   map[string]string
	Tolerations    []corev1.Toleration
	Resources      corev1.ResourceRequirements
	DeletionPolicy registryv1alpha1.DeletionPolicy
}

// Resolve applies the defaults to rm's spec and checks what the API server could not: an error
// here is bad input a person must fix.
func Resolve(rm *registryv1alpha1.RegistryMirror) (Spec, error) {
	s := rm.Spec
	upstream, err := NormalizeUpstream(s.UpstreamURL)
	if err != nil {
		return Spec{}, err
	}
	host := s.MirrorHost
	if host == "" {
		host = s.MasqueradeURL
	}
	if host == "" {
		if host, err = MirrorHost(upstream); err != nil {
			return Spec{}, err
		}
	}
	out := Spec{
		Name:              rm.Name,
		UpstreamURL:       upstream,
		MirrorHost:        strings.ToLower(host),
		CredentialsSecret: s.CredentialsSecret,
		Replicas:          DefaultReplicas,
		StorageSize:       DefaultStorageSize.DeepCopy(),
		TTL:               DefaultTTL,
		HighWater:         DefaultHighWater,
		LowWater:          DefaultLowWater,
		ServiceType:       corev1.ServiceTypeClusterIP,
		NodeSelector:      s.NodeSelector,
		Prefetch:          s.Prefetch,
		Tolerations:       s.Tolerations,
		Resources:         defaultResources(),
		DeletionPolicy:    registryv1alpha1.DeletionPolicyRetain,
	}
	if s.Replicas != nil {
		out.Replicas = *s.Replicas
	}
	if s.Storage != nil {
		if s.Storage.Size != nil {
			out.StorageSize = s.Storage.Size.DeepCopy()
		}
		out.StorageClassName = s.Storage.StorageClassName
	}
	if s.TTL != nil {
		if s.TTL.Duration < 0 {
			return Spec{}, fmt.Errorf("ttl %s is negative", s.TTL.Duration)
		}
		out.TTL = s.TTL.Duration
	}
	if e := s.Eviction; e != nil {
		if e.HighWaterPercent != 0 {
			out.HighWater, out.LowWater = e.HighWaterPercent, e.HighWaterPercent-10
		}
		if e.LowWaterPercent != nil {
			out.LowWater = *e.LowWaterPercent
		}
	}
	if err := CheckMarks(out.HighWater, out.LowWater); err != nil {
		return Spec{}, err
	}
	if s.ServiceType != "" {
		out.ServiceType = s.ServiceType
	}
	if s.Resources != nil {
		out.Resources = *s.Resources.DeepCopy()
	}
	if s.DeletionPolicy != "" {
		out.DeletionPolicy = s.DeletionPolicy
	}
	return out, nil
}

// CheckMarks checks a volume's eviction marks (percent used): what the CRD's validation says, for
// objects and files that did not go through it.
func CheckMarks(high, low int32) error {
	switch {
	case high < 10 || high > 99:
		return fmt.Errorf("eviction.highWaterPercent %d is not between 10 and 99", high)
	case low < 1 || low >= high:
		return fmt.Errorf("eviction.lowWaterPercent %d must be at least 1 and below eviction.highWaterPercent (%d)", low, high)
	}
	return nil
}

func defaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("100m"),
		corev1.ResourceMemory: resource.MustParse("128Mi"),
	}}
}

// NormalizeUpstream turns an upstreamUrl into scheme://host[:port]: a bare host means https, a
// trailing slash is dropped, and anything beyond the registry root is an error. Errors never
// quote credentials a URL may carry: they end up in status and Events.
func NormalizeUpstream(raw string) (string, error) {
	s := strings.TrimSpace(raw)
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // url.Error quotes the whole URL
		}
		return "", fmt.Errorf("upstreamUrl is not a URL: %w", err)
	}
	if u.User != nil {
		return "", errors.New("upstreamUrl carries credentials: put them in a Secret named by credentialsSecret")
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return "", fmt.Errorf("upstreamUrl %q: the scheme must be https or http", raw)
	case u.Host == "" || u.Hostname() == "":
		return "", fmt.Errorf("upstreamUrl %q has no host", raw)
	case strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("upstreamUrl %q has a path: a registry is served at its root (%s://%s)", raw, u.Scheme, u.Host)
	}
	return u.Scheme + "://" + strings.ToLower(u.Host), nil
}
