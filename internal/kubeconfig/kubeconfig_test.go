package kubeconfig

import (
	"bytes"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func TestRenderRoundTrips(t *testing.T) {
	data, err := Render(Params{Name: "ci", Server: "https://127.0.0.1:6443", CAData: []byte("pem"), Token: "tok", Namespace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	ns, _, err := clientcmd.NewDefaultClientConfig(*cfg, nil).Namespace()
	if err != nil || ns != "team-a" {
		t.Errorf("namespace = %q, %v; want team-a", ns, err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://127.0.0.1:6443" || rc.BearerToken != "tok" || string(rc.CAData) != "pem" {
		t.Errorf("rest config = host %q token %q ca %q", rc.Host, rc.BearerToken, rc.CAData)
	}
}

// Render writes what clientcmd.Write writes for the same config: byte for byte for ordinary
// values, and for values YAML would misread (words, numbers, indicators) a file that loads back
// to the same config.
func TestRenderWritesWhatClientcmdWrites(t *testing.T) {
	cases := []Params{
		{Name: "team-a", Server: "https://10.0.0.1:6443", CAData: []byte("-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n"), Token: "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln-_", Namespace: "team-a"},
		{Name: "ci", Server: "https://api.example.com", Token: "tok"},
		{Name: "true", Server: "https://[::1]:6443/x?y=1#z", Token: "a.b.c", Namespace: "null"},
		{Name: "1e3", Server: "http://h:80", Token: "0123", Namespace: "on"},
		{Name: "a: b", Server: "https://h/ #frag", Token: "t:", Namespace: "ns:"},
		{Name: "*x", Server: "&anchor", Token: "'q\"", Namespace: "é"},
		{Name: "", Server: "", Token: ""},
	}
	for _, p := range cases {
		got, err := Render(p)
		if err != nil {
			t.Fatal(err)
		}
		want := clientcmdWrite(t, p)
		if p.Name == "team-a" || p.Name == "ci" {
			if string(got) != string(want) {
				t.Errorf("%+v:\n%s\nclientcmd writes:\n%s", p, got, want)
			}
		}
		gotCfg, err := clientcmd.Load(got)
		if err != nil {
			t.Errorf("%+v: %v\n%s", p, err, got)
			continue
		}
		wantCfg, err := clientcmd.Load(want)
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(gotCfg, wantCfg) {
			t.Errorf("%+v loads as %+v, clientcmd's as %+v\n%s", p, gotCfg, wantCfg, got)
		}
	}
}

func clientcmdWrite(t *testing.T, p Params) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[p.Name] = &clientcmdapi.Cluster{Server: p.Server, CertificateAuthorityData: p.CAData}
	cfg.AuthInfos[p.Name] = &clientcmdapi.AuthInfo{Token: p.Token}
	cfg.Contexts[p.Name] = &clientcmdapi.Context{Cluster: p.Name, AuthInfo: p.Name, Namespace: p.Namespace}
	cfg.CurrentContext = p.Name
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Server reads what Render wrote without a YAML parse, and anything else (an edited kubeconfig)
// with one: the same answer either way.
func TestServerOfRenderedAndEditedKubeconfigs(t *testing.T) {
	for _, p := range []Params{
		{Name: "team-a", Server: "https://10.0.0.1:6443", CAData: []byte("pem"), Token: "a.b.c", Namespace: "team-a"},
		{Name: "true", Server: "https://[::1]:6443/x?y=1#z", Token: "t:"},
		{Name: "ci", Server: "", Token: "tok"},
	} {
		data, err := Render(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := parseRendered(data); !ok {
			t.Errorf("%+v: Render's own output is not read by its layout", p)
		}
		if got, err := Server(data); err != nil || got != p.Server {
			t.Errorf("%+v: Server = %q, %v", p, got, err)
		}
		// The same config laid out by clientcmd, and one with a comment added: parsed.
		for _, edited := range [][]byte{clientcmdWrite(t, p), append([]byte("# edited\n"), data...)} {
			if _, ok := parseRendered(edited); ok && !bytes.Equal(edited, data) {
				t.Errorf("%+v: an edited kubeconfig is read by the layout:\n%s", p, edited)
			}
			if got, err := Server(edited); err != nil || got != p.Server {
				t.Errorf("%+v: Server of an edited kubeconfig = %q, %v", p, got, err)
			}
		}
	}
	// A server edited in place is what the drift check must see.
	data, _ := Render(Params{Name: "a", Server: "https://right:6443", Token: "t"})
	edited := bytes.Replace(data, []byte("https://right:6443"), []byte("https://wrong:6443"), 1)
	if got, _ := Server(edited); got != "https://wrong:6443" {
		t.Errorf("edited server reads %q", got)
	}
}
