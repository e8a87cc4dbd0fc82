package mirror

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
)

func TestNormalizeUpstream(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "https://registry-1.docker.io", want: "https://registry-1.docker.io"},
		{in: "https://Quay.IO/", want: "https://quay.io"},
		{in: "quay.io", want: "https://quay.io"},
		{in: "hub.docker.io", want: "https://hub.docker.io"},
		{in: "http://registry.internal:5000", want: "http://registry.internal:5000"},
		{in: " https://ghcr.io ", want: "https://ghcr.io"},
		{in: "ftp://quay.io", err: "the scheme must be https or http"},
		{in: "https://quay.io/v2/", err: "has a path"},
		{in: "https://quay.io?x=1", err: "has a path"},
		{in: "https://", err: "has no host"},
		{in: "https://me:secret@quay.io", err: "carries credentials"},
		{in: "https://me:secret@quay.io:bad", err: "not a URL"},
	} {
		got, err := NormalizeUpstream(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one with %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%q: %q, %v; want %q", tc.in, got, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "secret"):
			t.Errorf("%q: the error shows the password: %v", tc.in, err)
		}
	}
}

func FuzzNormalizeUpstream(f *testing.F) {
	for _, s := range []string{"https://registry-1.docker.io", "quay.io", "http://a:1/", "https://u:p@h", "h:99999/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := NormalizeUpstream(raw)
		if err != nil {
			// A password long enough not to occur in the message by chance must not be in it.
			if _, password, ok := strings.Cut(userinfoOf(raw), ":"); ok && len(password) >= 6 && strings.Contains(err.Error(), password) {
				t.Errorf("error quotes the password %q: %v", password, err)
			}
			return
		}
		// A normalized upstream is its own normal form, and a root with a scheme and a host.
		again, err := NormalizeUpstream(got)
		if err != nil || again != got {
			t.Errorf("%q → %q → %q, %v", raw, got, again, err)
		}
		if !strings.HasPrefix(got, "https://") && !strings.HasPrefix(got, "http://") {
			t.Errorf("%q → %q has no scheme", raw, got)
		}
	})
}

// userinfoOf is what a URL parser would take for user:password in raw (a bare host counts as
// https://), or "".
func userinfoOf(raw string) string {
	s := strings.TrimSpace(raw)
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	if end := strings.IndexAny(s, "/?#"); end >= 0 {
		s = s[:end]
	}
	if at := strings.LastIndex(s, "@"); at > 0 {
		return s[:at]
	}
	return ""
}

func TestResolveDefaults(t *testing.T) {
	rm := &registryv1alpha1.RegistryMirror{
		ObjectMeta: metav1.ObjectMeta{Name: "hub"},
		Spec:       registryv1alpha1.RegistryMirrorSpec{UpstreamURL: "https://registry-1.docker.io"},
	}
	s, err := Resolve(rm)
	if err != nil {
		t.Fatal(err)
	}
	if s.MirrorHost != "docker.io" || s.Replicas != 2 || s.TTL != 168*time.Hour || s.StorageSize.String() != "20Gi" ||
		s.ServiceType != corev1.ServiceTypeClusterIP || s.DeletionPolicy != registryv1alpha1.DeletionPolicyRetain ||
		s.Resources.Requests.Cpu().String() != "100m" || s.HighWater != 85 || s.LowWater != 75 {
		t.Errorf("defaults: %+v", s)
	}
	for _, tc := range []struct {
		e         registryv1alpha1.Eviction
		high, low int32
		err       string
	}{
		{e: registryv1alpha1.Eviction{HighWaterPercent: 95}, high: 95, low: 85},
		{e: registryv1alpha1.Eviction{HighWaterPercent: 95, LowWaterPercent: new(int32(50))}, high: 95, low: 50},
		{e: registryv1alpha1.Eviction{LowWaterPercent: new(int32(30))}, high: 85, low: 30},
		{e: registryv1alpha1.Eviction{HighWaterPercent: 50, LowWaterPercent: new(int32(60))}, err: "below eviction.highWaterPercent"},
		{e: registryv1alpha1.Eviction{HighWaterPercent: 100}, err: "highWaterPercent 100"},
	} {
		m := rm.DeepCopy()
		m.Spec.Eviction = &tc.e
		s, err := Resolve(m)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%+v: %v, want an error with %q", tc.e, err, tc.err)
		case tc.err == "" && (err != nil || s.HighWater != tc.high || s.LowWater != tc.low):
			t.Errorf("%+v: marks %d/%d (%v), want %d/%d", tc.e, s.HighWater, s.LowWater, err, tc.high, tc.low)
		}
	}
	rm.Spec.MasqueradeURL = "Local.Docker.IO"
	if s, _ := Resolve(rm); s.MirrorHost != "local.docker.io" {
		t.Errorf("masqueradeUrl: host %q", s.MirrorHost)
	}
	rm.Spec.MirrorHost = "mirror.example:5000"
	if s, _ := Resolve(rm); s.MirrorHost != "mirror.example:5000" {
		t.Errorf("mirrorHost: host %q", s.MirrorHost)
	}
	rm.Spec.UpstreamURL = "https://quay.io/path"
	if _, err := Resolve(rm); err == nil {
		t.Errorf("a path was accepted")
	}
}

func TestNames(t *testing.T) {
	longest := strings.Repeat("a", 40) // the CRD's limit on a mirror's name
	// A StatefulSet's pods carry a controller-revision-hash label of <name>-<10 characters>,
	// which must stay a label value (63); Services and the rest are DNS labels (63).
	if n := CacheName(longest); len(n) > 63-11 {
		t.Errorf("%s is %d characters", n, len(n))
	}
	for _, n := range []string{HeadlessName(longest), SecretName(longest), AgentName(longest)} {
		if len(n) > 63 {
			t.Errorf("%s is %d characters", n, len(n))
		}
	}
	if got := PVCName("hub", 1); got != "cache-mirror-hub-1" {
		t.Errorf("PVCName %q", got)
	}
}

func TestEndpoint(t *testing.T) {
	for _, tc := range []struct {
		svc  corev1.Service
		want string
	}{
		{corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.12"}}, "http://10.96.0.12:5000"},
		{corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "fd00::12"}}, "http://[fd00::12]:5000"},
		{corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP}}, ""},
		{corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.12",
			Ports: []corev1.ServicePort{{Name: "registry", NodePort: 30500}}}}, "http://127.0.0.1:30500"},
		{corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.12",
			Ports: []corev1.ServicePort{{Name: "registry"}}}}, ""},
	} {
		if got := Endpoint(&tc.svc); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.svc.Spec, got, tc.want)
		}
	}
}

func TestConfigHash(t *testing.T) {
	a := ConfigHash(map[string][]byte{"config.yml": []byte("x"), "password": []byte("p")})
	if a != ConfigHash(map[string][]byte{"password": []byte("p"), "config.yml": []byte("x")}) {
		t.Errorf("the hash depends on map order")
	}
	for _, other := range []map[string][]byte{
		{"config.yml": []byte("x"), "password": []byte("q")},
		{"config.yml": []byte("xp"), "password": []byte("")},
		{"config.yml": []byte("x")},
	} {
		if ConfigHash(other) == a {
			t.Errorf("%v hashes like the original", other)
		}
	}
}

// TestObjectsGolden renders every object of two mirrors (defaults; every option set) and compares
// them with testdata/objects.
func TestObjectsGolden(t *testing.T) {
	in := Install{Namespace: "quartermaster-mirrors", Image: "quartermaster:v1", AgentServiceAccount: "quartermaster-node-agent", CacheServiceAccount: "quartermaster-mirror-cache"}
	full := &registryv1alpha1.RegistryMirror{
		ObjectMeta: metav1.ObjectMeta{Name: "internal"},
		Spec: registryv1alpha1.RegistryMirrorSpec{
			UpstreamURL: "http://registry.internal:5000", CredentialsSecret: "internal-pull", Replicas: ptr.To[int32](3),
			Storage: &registryv1alpha1.Storage{Size: ptr.To(resource.MustParse("50Gi")), StorageClassName: ptr.To("fast")},
			TTL:     &metav1.Duration{Duration: 0}, MirrorHost: "registry.internal:5000", ServiceType: corev1.ServiceTypeNodePort,
			NodeSelector:   map[string]string{"pool": "workers"},
			Tolerations:    []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Resources:      &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
			DeletionPolicy: registryv1alpha1.DeletionPolicyDelete,
		},
	}
	for name, rm := range map[string]*registryv1alpha1.RegistryMirror{
		"defaults": {ObjectMeta: metav1.ObjectMeta{Name: "hub"}, Spec: registryv1alpha1.RegistryMirrorSpec{UpstreamURL: "https://registry-1.docker.io"}},
		"full":     full,
	} {
		t.Run(name, func(t *testing.T) {
			s, err := Resolve(rm)
			if err != nil {
				t.Fatal(err)
			}
			config, err := CacheConfig(CacheParams{UpstreamURL: s.UpstreamURL, TTL: s.TTL})
			if err != nil {
				t.Fatal(err)
			}
			var creds *Credentials
			if s.CredentialsSecret != "" {
				creds = &Credentials{Username: "puller", Password: "not-a-secret"}
			}
			secret := CacheSecret(in, s, config, creds)
			var buf bytes.Buffer
			for _, obj := range []any{secret, HeadlessService(in, s), Service(in, s), StatefulSet(in, s, ConfigHash(secret.Data)),
				PodDisruptionBudget(in, s), AgentDaemonSet(in, s, "http://10.96.0.12:5000")} {
				b, err := yaml.Marshal(obj)
				if err != nil {
					t.Fatal(err)
				}
				buf.WriteString("---\n")
				buf.Write(b)
			}
			golden(t, filepath.Join("objects", name+".yaml"), buf.Bytes())
		})
	}
}
