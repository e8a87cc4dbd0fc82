package namespaces

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quartermaster-dev/quartermaster/internal/kubeconfig"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// The cache's summary of a credentials Secret reads as the Secret itself does.
func TestSummarizedCredentialsReadAsTheSecret(t *testing.T) {
	t.Parallel()
	config, err := kubeconfig.Render(kubeconfig.Params{Name: "team-a", Server: "https://api.example.com:6443",
		CAData: []byte("ca-pem"), Token: "a.b.c", Namespace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	whole := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: nsrequest.Labels("namespace-requests", "team-a")}, Data: map[string][]byte{keyToken: []byte("a.b.c"), keyCA: []byte("ca-pem"),
		keyNamespace: []byte("team-a"), keyKubeconfig: config}}
	out, err := summarizeCredentials(whole.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	summarized := out.(*corev1.Secret)
	if len(summarized.Data) != 1 || len(summarized.Data[keySummary]) > 200 {
		t.Errorf("summarized data %v, want only the summary", summarized.Data)
	}
	if got, want := credentialsOf(summarized), credentialsOf(whole); got != want || want.Server != "https://api.example.com:6443" || !want.HasToken || !want.NamespaceIsName {
		t.Errorf("summary reads %+v, the Secret %+v", got, want)
	}
	again, _ := summarizeCredentials(summarized.DeepCopy())
	if credentialsOf(again.(*corev1.Secret)) != credentialsOf(whole) {
		t.Error("summarizing a summary changed it")
	}
	if c := credentialsOf(&corev1.Secret{Data: map[string][]byte{keyKubeconfig: []byte("not yaml: [")}}); c.Server != "" || c.HasToken {
		t.Errorf("a broken Secret reads %+v, want no server and no token (stale)", c)
	}
	// A Secret that is not the operator's (a source of the copies) is kept whole.
	source := whole.DeepCopy()
	source.Labels = map[string]string{nsrequest.LabelCopySource: "true"}
	if out, _ := summarizeCredentials(source.DeepCopy()); len(out.(*corev1.Secret).Data) != len(whole.Data) {
		t.Errorf("a copy source was summarized: %v", out.(*corev1.Secret).Data)
	}
}
