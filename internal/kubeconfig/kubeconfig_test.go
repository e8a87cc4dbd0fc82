package kubeconfig

import (
	"testing"

	"k8s.io/client-go/tools/clientcmd"
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
