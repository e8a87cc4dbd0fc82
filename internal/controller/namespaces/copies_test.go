package namespaces

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// TestCopiesOfSharedObjects: the Secrets and ConfigMaps the defaults name are copied from the
// copy namespace into each requested namespace (only sources marked for it), kept as their source
// is, and removed when the defaults drop them.
func TestCopiesOfSharedObjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// envtest runs no controller-manager, whose aggregation controller fills the admin ClusterRole
	// from the edit and view roles: give it the part of those rules the copies use (no other test
	// relies on what the admin role lacks).
	adminRole := &rbacv1.ClusterRole{}
	must(t, env.Client.Get(ctx, client.ObjectKey{Name: "admin"}, adminRole))
	adminRole.Rules = append(adminRole.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets", "configmaps"}, Verbs: []string{"*"}})
	must(t, env.Client.Update(ctx, adminRole))
	from := env.Namespace(t)
	marked := map[string]string{nsrequest.LabelCopySource: "true"}
	pull := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: from, Name: "registry-pull", Labels: marked},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"registry.example.com":{"auth":"dTpw"}}}`)},
	}
	must(t, env.Client.Create(ctx, pull))
	must(t, env.Client.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: from, Name: "corporate-ca", Labels: marked}, Data: map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----"},
	}))
	copying := func(secrets ...string) func(*Options) {
		return func(o *Options) {
			d := filepath.Join(t.TempDir(), "defaults.yaml")
			must(t, os.WriteFile(d, []byte("copy:\n  secrets: ["+strings.Join(secrets, ", ")+"]\n  configMaps: [corporate-ca]\n"), 0o600))
			o.DefaultsFile, o.CopyFromNamespace = d, from
		}
	}
	f := start(t, copying("registry-pull", "later"))
	f.request(t, "ci-copy", nil)

	t.Run("a source that is missing or not marked holds the request", func(t *testing.T) {
		cm := f.waitStatus(t, "ci-copy", nsrequest.StatusPending)
		eventually(t, "the request to name the missing source", func() bool {
			must(t, f.c.Get(ctx, client.ObjectKeyFromObject(cm), cm))
			return cm.Annotations[nsrequest.AnnotationReason] == ReasonCopySource && strings.Contains(cm.Annotations[nsrequest.AnnotationMessage], "Secret "+from+"/later")
		}, func() string { return cm.Annotations[nsrequest.AnnotationMessage] })
		// What could be copied was.
		got := &corev1.Secret{}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: "ci-copy", Name: "registry-pull"}, got))
		if got.Type != corev1.SecretTypeDockerConfigJson || string(got.Data[corev1.DockerConfigJsonKey]) != string(pull.Data[corev1.DockerConfigJsonKey]) ||
			got.Labels[nsrequest.LabelCopyOf] != "registry-pull" || !nsrequest.IsOurs(got.Labels, f.rns, "ci-copy") {
			t.Errorf("the copy = %+v", got)
		}
		// An object of that name without the mark is not copied.
		later := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: from, Name: "later"}, StringData: map[string]string{"k": "v"}}
		must(t, f.c.Create(ctx, later))
		f.waitStatus(t, "ci-copy", nsrequest.StatusPending)
		if err := f.c.Get(ctx, client.ObjectKey{Namespace: "ci-copy", Name: "later"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Errorf("an unmarked source was copied: %v", err)
		}
		// Marked, it is copied and the request is Ready.
		later.Labels = marked
		must(t, f.c.Update(ctx, later))
		f.waitStatus(t, "ci-copy", nsrequest.StatusReady)
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: "ci-copy", Name: "later"}, &corev1.Secret{}))
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: "ci-copy", Name: "corporate-ca"}, &corev1.ConfigMap{}))
	})

	t.Run("a changed source reaches the copies", func(t *testing.T) {
		must(t, f.c.Get(ctx, client.ObjectKeyFromObject(pull), pull))
		pull.Data[corev1.DockerConfigJsonKey] = []byte(`{"auths":{"registry.example.com":{"auth":"bmV3"}}}`)
		must(t, f.c.Update(ctx, pull))
		got := &corev1.Secret{}
		eventually(t, "the copy to follow its source", func() bool {
			must(t, f.c.Get(ctx, client.ObjectKey{Namespace: "ci-copy", Name: "registry-pull"}, got))
			return strings.Contains(string(got.Data[corev1.DockerConfigJsonKey]), "bmV3")
		}, func() string { return string(got.Data[corev1.DockerConfigJsonKey]) })
	})

	t.Run("a copy the defaults drop is removed", func(t *testing.T) {
		f.stop(t)
		f = runController(t, f.rns, copying("registry-pull"))
		eventually(t, "the dropped copy to go", func() bool {
			return apierrors.IsNotFound(f.c.Get(ctx, client.ObjectKey{Namespace: "ci-copy", Name: "later"}, &corev1.Secret{}))
		}, func() string { return "Secret ci-copy/later still there" })
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: "ci-copy", Name: "registry-pull"}, &corev1.Secret{}))
		f.waitStatus(t, "ci-copy", nsrequest.StatusReady)
	})
}

func TestCopyFlagsAreChecked(t *testing.T) {
	t.Parallel()
	d := filepath.Join(t.TempDir(), "defaults.yaml")
	must(t, os.WriteFile(d, []byte("copy:\n  secrets: [registry-pull]\n"), 0o600))
	o := &Options{RequestsNamespace: "namespace-requests", DefaultsFile: d, TokenTTL: MinTokenTTLForTest, MaxTokenTTL: MinTokenTTLForTest, DenyNames: "kube-.*"}
	if _, _, err := o.policy(); err == nil || !strings.Contains(err.Error(), "set --copy-from-namespace") {
		t.Errorf("copies without a source namespace: %v", err)
	}
	o.CopyFromNamespace = o.RequestsNamespace
	if _, _, err := o.policy(); err == nil || !strings.Contains(err.Error(), "must not be the requests namespace") {
		t.Errorf("copies from the requests namespace: %v", err)
	}
	must(t, os.WriteFile(d, []byte("copy:\n  secrets: [Bad_Name, ok]\n"), 0o600))
	o.CopyFromNamespace = "platform-shared"
	if _, _, err := o.policy(); err == nil || !strings.Contains(err.Error(), `"Bad_Name" is no object name`) {
		t.Errorf("a bad name: %v", err)
	}
}

// MinTokenTTLForTest is the shortest token ttl the flags accept.
const MinTokenTTLForTest = nsrequest.MinTokenTTL
