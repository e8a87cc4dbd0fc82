package mirror

import (
	"slices"
	"strings"
	"testing"
)

// A workload's image names the pin the kubelet's pull would need: Docker Hub's short names
// normalized, a digest before a tag, another registry's image nothing.
func TestPinRef(t *testing.T) {
	const dig = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
	for _, tc := range []struct {
		image, host, want string
	}{
		{"nginx", "docker.io", "library/nginx:latest"},
		{"nginx:1.27", "docker.io", "library/nginx:1.27"},
		{"docker.io/library/nginx:1.27", "docker.io", "library/nginx:1.27"},
		{"bitnami/redis:7", "docker.io", "bitnami/redis:7"},
		{"nginx:1.27@" + dig, "docker.io", "library/nginx@" + dig},
		{"quay.io/prometheus/node-exporter:v1.8.0", "quay.io", "prometheus/node-exporter:v1.8.0"},
		{"Registry.Internal:5000/team/app:v1", "registry.internal:5000", "team/app:v1"},
		{"quay.io/prometheus/node-exporter:v1.8.0", "docker.io", ""},
		{"nginx", "quay.io", ""},
		{"UPPER/case", "docker.io", ""},
		{"", "docker.io", ""},
	} {
		got, ok := PinRef(tc.image, tc.host)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("PinRef(%q, %q) = %q, %v; want %q", tc.image, tc.host, got, ok, tc.want)
		}
		if ok {
			if _, _, _, err := SplitPin(got); err != nil {
				t.Errorf("SplitPin(%q): %v", got, err)
			}
		}
	}
	if h := ImageHost("nginx"); h != "docker.io" {
		t.Errorf("ImageHost(nginx) = %q", h)
	}
}

func TestParsePins(t *testing.T) {
	p, err := ParsePins([]byte(`{"images":{"library/nginx:1.27":"","team/app@sha256:0000000000000000000000000000000000000000000000000000000000000001":"2026-12-04T10:00:00Z"}}`))
	if err != nil || len(p.Refs()) != 2 || p.Refs()[0] != "library/nginx:1.27" {
		t.Fatalf("ParsePins = %+v, %v", p, err)
	}
	for _, bad := range []struct{ in, want string }{
		{`{"images":{"nginx":""}}`, "not repository:tag"},
		{`{"images":{"library/nginx:1.27":"tomorrow"}}`, "RFC 3339"},
		{`{"images":{"Library/nginx:1.27":""}}`, "pin"},
		{`{"images":{"library/nginx@sha256:12":""}}`, "pin"},
		{`[`, PinsFile},
		{`{"images":{},"platforms":["linux"]}`, "not os/arch"},
		{`{"images":{},"platforms":["linux/arm64/v8"]}`, "not os/arch"},
		{`{"images":{},"platforms":["Linux/amd64"]}`, "not os/arch"},
	} {
		if _, err := ParsePins([]byte(bad.in)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParsePins(%s) = %v, want an error with %q", bad.in, err, bad.want)
		}
	}
	if p, err := ParsePins([]byte(`{"images":{},"platforms":["linux/amd64","linux/arm64"]}`)); err != nil || !slices.Equal(p.Platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("ParsePins with platforms = %+v, %v", p, err)
	}
	cm, err := PinsConfigMap(Install{Namespace: "ns"}, Spec{Name: "hub"}, Pins{})
	if err != nil || cm.Name != "mirror-hub-pins" || cm.Data[PinsFile] != `{"images":{}}` {
		t.Errorf("PinsConfigMap = %+v, %v", cm, err)
	}
}
