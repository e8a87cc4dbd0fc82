package namespaces

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quartermaster-dev/quartermaster/internal/drift"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

func TestRequestGetsNamespaceRBACDefaultsAndCredentials(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	f.request(t, "ci-branch-foo", nil)
	cm := f.waitStatus(t, "ci-branch-foo", nsrequest.StatusReady)

	ns := &corev1.Namespace{}
	must(t, f.c.Get(ctx, client.ObjectKey{Name: "ci-branch-foo"}, ns))
	if !nsrequest.IsOurs(ns.Labels, f.rns, "ci-branch-foo") {
		t.Errorf("namespace labels = %v", ns.Labels)
	}
	in := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: "ci-branch-foo", Name: name} }

	must(t, f.c.Get(ctx, in("admin"), &corev1.ServiceAccount{}))
	admin := &rbacv1.RoleBinding{}
	must(t, f.c.Get(ctx, in(nsrequest.AdminBindingName), admin))
	if admin.RoleRef.Kind != "ClusterRole" || admin.RoleRef.Name != "admin" ||
		len(admin.Subjects) != 1 || admin.Subjects[0].Name != "admin" || admin.Subjects[0].Namespace != "ci-branch-foo" {
		t.Errorf("admin RoleBinding = %+v %+v", admin.RoleRef, admin.Subjects)
	}
	self := &rbacv1.Role{}
	must(t, f.c.Get(ctx, in(nsrequest.SelfRoleName), self))
	if len(self.Rules) != 1 || !slices.Equal(self.Rules[0].ResourceNames, []string{"ci-branch-foo"}) ||
		!slices.Equal(self.Rules[0].Verbs, []string{"get", "delete"}) || !slices.Equal(self.Rules[0].Resources, []string{"namespaces"}) {
		t.Errorf("self Role rules = %+v", self.Rules)
	}
	selfBinding := &rbacv1.RoleBinding{}
	must(t, f.c.Get(ctx, in(nsrequest.SelfRoleName), selfBinding))
	if selfBinding.RoleRef.Kind != "Role" || selfBinding.RoleRef.Name != nsrequest.SelfRoleName {
		t.Errorf("self RoleBinding roleRef = %+v", selfBinding.RoleRef)
	}
	quota := &corev1.ResourceQuota{}
	must(t, f.c.Get(ctx, in(nsrequest.DefaultsObjectsName), quota))
	if quota.Spec.Hard.Pods().String() != "20" {
		t.Errorf("quota = %v", quota.Spec.Hard)
	}
	must(t, f.c.Get(ctx, in(nsrequest.DefaultsObjectsName), &corev1.LimitRange{}))
	np := &networkingv1.NetworkPolicy{}
	must(t, f.c.Get(ctx, in(nsrequest.DefaultsObjectsName), np))
	if len(np.Spec.Ingress) != 1 || np.Spec.Ingress[0].From[0].NamespaceSelector != nil {
		t.Errorf("network policy does not isolate the namespace: %+v", np.Spec)
	}

	secret := &corev1.Secret{}
	must(t, f.c.Get(ctx, client.ObjectKey{Namespace: f.rns, Name: "ci-branch-foo"}, secret))
	if secret.Type != corev1.SecretTypeOpaque {
		t.Errorf("secret type = %s", secret.Type)
	}
	for _, k := range []string{"token", "ca.crt", "namespace", "kubeconfig"} {
		if len(secret.Data[k]) == 0 {
			t.Errorf("secret has no %q", k)
		}
	}
	expires, err := time.Parse(time.RFC3339, secret.Annotations[nsrequest.AnnotationTokenExpiresAt])
	if err != nil || expires.Before(time.Now().Add(23*time.Hour)) || expires.After(time.Now().Add(25*time.Hour)) {
		t.Errorf("token-expires-at = %q, want about 24h from now", secret.Annotations[nsrequest.AnnotationTokenExpiresAt])
	}
	kc, err := clientcmd.Load(secret.Data["kubeconfig"])
	must(t, err)
	cur := kc.Contexts[kc.CurrentContext]
	if cur.Namespace != "ci-branch-foo" || kc.Clusters[cur.Cluster].Server != env.Config.Host ||
		kc.AuthInfos[cur.AuthInfo].Token != string(secret.Data["token"]) {
		t.Errorf("kubeconfig context %+v, server %q", cur, kc.Clusters[cur.Cluster].Server)
	}

	// The namespace owns the request and the Secret, so deleting it removes both.
	for _, o := range []client.Object{cm, secret} {
		refs := o.GetOwnerReferences()
		if len(refs) != 1 || refs[0].UID != ns.UID || refs[0].Kind != "Namespace" {
			t.Errorf("%s ownerReferences = %+v, want the namespace", o.GetName(), refs)
		}
	}
	if msg := cm.Annotations[nsrequest.AnnotationMessage]; !strings.Contains(msg, "the kubeconfig names API server "+env.Config.Host+" (the address the manager itself uses)") {
		t.Errorf("the status message does not say which API server the kubeconfig names: %q", msg)
	}

	// One Event tells the outcome: the request is Ready, with where its credentials are.
	ready := f.waitEvent(t, cm, "Ready")
	if !strings.Contains(ready.Note, "credentials in Secret "+f.rns+"/ci-branch-foo") {
		t.Errorf("the Ready Event does not say where the credentials are: %q", ready.Note)
	}
	for _, obj := range []client.Object{cm, secret, ns} {
		for _, e := range f.events(t, obj) {
			if strings.Contains(e.Note, string(secret.Data["token"])) {
				t.Errorf("an Event carries the token: %q", e.Note)
			}
			if obj != cm {
				t.Errorf("an Event about %s %s besides the request's: %s %q", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), e.Reason, e.Note)
			}
		}
	}
}

func TestRefusedRequestsGetNoNamespaceAndNoSecret(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	must(t, f.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "existing"}}))
	// Someone who may create namespaces forges the operator's labels to catch a future request.
	must(t, f.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "forged", Labels: nsrequest.Labels(f.rns, "forged")}}))
	must(t, f.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.rns, Name: "secret-taken"},
		StringData: map[string]string{"mine": "not yours"}}))
	cases := []struct {
		name   string
		data   map[string]string
		status nsrequest.Status
		reason string
	}{
		{"kube-tools", nil, nsrequest.StatusInvalid, "Denied"},
		{"default", nil, nsrequest.StatusInvalid, "Denied"},
		{f.rns, nil, nsrequest.StatusInvalid, "Denied"},
		{operatorNS, nil, nsrequest.StatusInvalid, "Denied"},
		{"dotted.name", nil, nsrequest.StatusInvalid, "InvalidName"},
		{"bad-ttl", map[string]string{"ttl": "soon"}, nsrequest.StatusInvalid, "InvalidTTL"},
		{"bad-token-ttl", map[string]string{"token-ttl": "-1h"}, nsrequest.StatusInvalid, "InvalidTokenTTL"},
		{"existing", nil, nsrequest.StatusConflict, "NamespaceConflict"},
		{"secret-taken", nil, nsrequest.StatusConflict, "SecretConflict"},
		{"forged", nil, nsrequest.StatusConflict, "NamespaceConflict"},
	}
	for _, tc := range cases {
		f.request(t, tc.name, tc.data)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cm := f.waitStatus(t, tc.name, tc.status)
			if cm.Annotations[nsrequest.AnnotationMessage] == "" {
				t.Error("no message")
			}
			ev := f.waitEvent(t, cm, tc.reason)
			if ev.Type != corev1.EventTypeWarning {
				t.Errorf("event type %s, want Warning", ev.Type)
			}
			secret := &corev1.Secret{}
			err := f.c.Get(ctx, client.ObjectKey{Namespace: f.rns, Name: tc.name}, secret)
			if tc.reason == "SecretConflict" {
				if string(secret.Data["mine"]) != "not yours" || secret.Data["token"] != nil {
					t.Errorf("the foreign Secret was changed: %v", secret.Data)
				}
			} else if !apierrors.IsNotFound(err) {
				t.Errorf("a Secret exists for a refused request (err %v)", err)
			}
			if tc.reason != "NamespaceConflict" && tc.name != "default" && tc.name != f.rns {
				err := f.c.Get(ctx, client.ObjectKey{Name: tc.name}, &corev1.Namespace{})
				if !apierrors.IsNotFound(err) {
					t.Errorf("a namespace was created for a refused request (err %v)", err)
				}
			}
		})
	}
	// The conflicting namespace got nothing from us.
	ns := &corev1.Namespace{}
	must(t, f.c.Get(ctx, client.ObjectKey{Name: "existing"}, ns))
	if len(ns.Labels) > 1 { // kubernetes.io/metadata.name only
		t.Errorf("the existing namespace was labelled: %v", ns.Labels)
	}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: "existing", Name: "admin"}, &corev1.ServiceAccount{}); !apierrors.IsNotFound(err) {
		t.Errorf("a ServiceAccount was made in a namespace we did not create (err %v)", err)
	}
}

func TestAllowNamesRefusesOthers(t *testing.T) {
	t.Parallel()
	f := start(t, func(o *Options) { o.AllowNames = "ci-.*" })
	f.request(t, "ci-ok", nil)
	f.request(t, "prod", nil)
	f.waitStatus(t, "ci-ok", nsrequest.StatusReady)
	cm := f.waitStatus(t, "prod", nsrequest.StatusInvalid)
	f.waitEvent(t, cm, "NotAllowed")
}

func TestIgnoredConfigMapsAreNotRequests(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: f.rns, Name: "not-a-request",
		Labels: map[string]string{nsrequest.LabelIgnore: "true"}}}
	must(t, f.c.Create(ctx, cm))
	f.request(t, "marker", nil)
	f.waitStatus(t, "marker", nsrequest.StatusReady) // the controller is working
	must(t, f.c.Get(ctx, client.ObjectKeyFromObject(cm), cm))
	if _, ok := cm.Annotations[nsrequest.AnnotationStatus]; ok {
		t.Error("an ignored ConfigMap got a status")
	}
	if err := f.c.Get(ctx, client.ObjectKey{Name: "not-a-request"}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Errorf("a namespace was created for an ignored ConfigMap (err %v)", err)
	}
}

// TestSecondReconcileWritesNothing counts the API requests of a reconcile of a request that is
// already served: reads only, no write.
func TestSecondReconcileWritesNothing(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	f.request(t, "steady", map[string]string{"ttl": "72h"})
	f.waitStatus(t, "steady", nsrequest.StatusReady)

	cfg, counter := testenv.Counting(env.Config)
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	must(t, err)
	r := *f.reconciler
	r.Client, r.APIReader = c, c
	res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Namespace: f.rns, Name: "steady"}})
	must(t, err)
	if counter.Writes() != 0 {
		t.Errorf("a reconcile of a served request wrote %d times: %v", counter.Writes(), counter.Log())
	}
	// It comes back in time to refresh the token before 80% of its 24h lifetime.
	if res.RequeueAfter <= 0 || res.RequeueAfter > 80*24*time.Hour/100 {
		t.Errorf("RequeueAfter = %s", res.RequeueAfter)
	}
}

func TestTokenTTLPerRequestIsCapped(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	f.request(t, "short", map[string]string{"token-ttl": "1h"})
	f.request(t, "long", map[string]string{"token-ttl": "1000h"})
	f.waitStatus(t, "short", nsrequest.StatusReady)
	cm := f.waitStatus(t, "long", nsrequest.StatusReady)
	for name, want := range map[string]time.Duration{"short": time.Hour, "long": 48 * time.Hour} {
		s := &corev1.Secret{}
		must(t, f.c.Get(context.Background(), client.ObjectKey{Namespace: f.rns, Name: name}, s))
		st := tokenState(s)
		if got := st.ExpiresAt.Sub(st.IssuedAt); got < want-time.Minute || got > want+time.Minute {
			t.Errorf("%s: token lifetime %s, want %s", name, got, want)
		}
	}
	if msg := cm.Annotations[nsrequest.AnnotationMessage]; !strings.Contains(msg, "capped") {
		t.Errorf("the message does not say the token-ttl was capped: %q", msg)
	}
}

func TestTokenIsRefreshedWhenDue(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	f.request(t, "refresh", nil)
	f.waitStatus(t, "refresh", nsrequest.StatusReady)
	key := client.ObjectKey{Namespace: f.rns, Name: "refresh"}
	s := &corev1.Secret{}
	must(t, f.c.Get(ctx, key, s))
	oldToken := string(s.Data["token"])

	// Pretend the token was issued 20 hours ago: past 80% of its life, it is due.
	s.Annotations[nsrequest.AnnotationTokenIssuedAt] = time.Now().Add(-20 * time.Hour).UTC().Format(time.RFC3339)
	s.Annotations[nsrequest.AnnotationTokenExpiresAt] = time.Now().Add(4 * time.Hour).UTC().Format(time.RFC3339)
	must(t, f.c.Update(ctx, s))
	eventually(t, "a new token", func() bool {
		return f.c.Get(ctx, key, s) == nil && string(s.Data["token"]) != oldToken
	}, nil)
	if exp := tokenState(s).ExpiresAt; exp.Before(time.Now().Add(23 * time.Hour)) {
		t.Errorf("the new token expires at %s", exp)
	}
	f.waitEvent(t, s, "CredentialsRefreshed")
}

func TestDriftIsRepaired(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	f.request(t, "drift", nil)
	f.waitStatus(t, "drift", nsrequest.StatusReady)
	key := client.ObjectKey{Namespace: "drift", Name: nsrequest.AdminBindingName}
	rb := &rbacv1.RoleBinding{}
	must(t, f.c.Get(ctx, key, rb))
	must(t, f.c.Delete(ctx, rb))
	role := &rbacv1.Role{}
	must(t, f.c.Get(ctx, client.ObjectKey{Namespace: "drift", Name: nsrequest.SelfRoleName}, role))
	role.Rules[0].ResourceNames = []string{"someone-else"}
	must(t, f.c.Update(ctx, role))

	eventually(t, "the admin RoleBinding to be re-created", func() bool {
		return f.c.Get(ctx, key, &rbacv1.RoleBinding{}) == nil
	}, nil)
	eventually(t, "the self Role to be restored", func() bool {
		err := f.c.Get(ctx, client.ObjectKeyFromObject(role), role)
		return err == nil && slices.Equal(role.Rules[0].ResourceNames, []string{"drift"})
	}, nil)

	// Someone's edit of a default is undone; the label they added stays (and what the API server
	// defaulted, the LimitRange's defaultRequest, never counted as an edit: TestSecondReconcileWritesNothing).
	lr := &corev1.LimitRange{}
	lrKey := client.ObjectKey{Namespace: "drift", Name: nsrequest.DefaultsObjectsName}
	must(t, f.c.Get(ctx, lrKey, lr))
	lr.Labels["team"] = "payments"
	lr.Spec.Limits[0].Default[corev1.ResourceCPU] = resource.MustParse("4")
	must(t, f.c.Update(ctx, lr))
	eventually(t, "the LimitRange's default to be restored, the other label kept", func() bool {
		err := f.c.Get(ctx, lrKey, lr)
		return err == nil && lr.Spec.Limits[0].Default.Cpu().String() == "500m" && lr.Labels["team"] == "payments"
	}, func() string { return fmt.Sprintf("%v %v", lr.Spec.Limits, lr.Labels) })
}

// An object an earlier release made (its own hash, the request annotation every object then
// carried) is brought to this release's want by one update that takes the request annotation
// off and leaves others' annotations.
func TestObjectsOfAnEarlierReleaseAreTakenOver(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	f.request(t, "earlier", nil)
	f.waitStatus(t, "earlier", nsrequest.StatusReady)
	key := client.ObjectKey{Namespace: "earlier", Name: nsrequest.ServiceAccountName}
	sa := &corev1.ServiceAccount{}
	must(t, f.c.Get(ctx, key, sa))
	ours := sa.Annotations[drift.HashAnnotation]
	sa.Annotations = map[string]string{
		drift.HashAnnotation:        "an-earlier-want",
		nsrequest.AnnotationRequest: f.rns + "/earlier",
		"team":                      "payments",
	}
	must(t, f.c.Update(ctx, sa))
	eventually(t, "the ServiceAccount to carry this release's hash and no request annotation", func() bool {
		err := f.c.Get(ctx, key, sa)
		return err == nil && maps.Equal(sa.Annotations, map[string]string{drift.HashAnnotation: ours, "team": "payments"})
	}, func() string { return fmt.Sprint(sa.Annotations) })
}

func TestDeletingTheRequestLeavesTheNamespace(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	cm := f.request(t, "keep-me", nil)
	f.waitStatus(t, "keep-me", nsrequest.StatusReady)
	must(t, f.c.Delete(ctx, cm))
	// The controller's reaction to the deletion, run here rather than waited for: a reconcile of
	// the request once its cache no longer has it (the manager's own may run beside it).
	key := client.ObjectKeyFromObject(cm)
	eventually(t, "the controller's cache to see the request deleted", func() bool {
		return apierrors.IsNotFound(f.reconciler.Client.Get(ctx, key, &corev1.ConfigMap{}))
	}, nil)
	res, err := f.reconciler.Reconcile(ctx, reconcile.Request{NamespacedName: key})
	must(t, err)
	if res.RequeueAfter != 0 {
		t.Errorf("the deleted request (no ttl) is looked at again in %s", res.RequeueAfter)
	}
	ns := &corev1.Namespace{}
	must(t, f.c.Get(ctx, client.ObjectKey{Name: "keep-me"}, ns))
	if ns.DeletionTimestamp != nil {
		t.Error("deleting the request deleted the namespace")
	}
}

func TestTTLDeletesTheNamespace(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	f.request(t, "short-lived", map[string]string{"ttl": "2s"})
	ns := &corev1.Namespace{}
	eventually(t, "the namespace to be deleted after its ttl", func() bool {
		// envtest has no namespace controller: a deleted namespace stays Terminating.
		return f.c.Get(ctx, client.ObjectKey{Name: "short-lived"}, ns) == nil && ns.DeletionTimestamp != nil
	}, nil)
	if ns.Annotations[nsrequest.AnnotationExpiresAt] == "" {
		t.Error("the namespace had no expires-at annotation")
	}
	f.waitEvent(t, ns, "Expired")
}

func TestTTLHoldsAfterTheRequestIsDeleted(t *testing.T) {
	t.Parallel()
	f := start(t, nil)
	ctx := context.Background()
	cm := f.request(t, "orphaned", map[string]string{"ttl": "4s"})
	f.waitStatus(t, "orphaned", nsrequest.StatusReady)
	must(t, f.c.Delete(ctx, cm))
	ns := &corev1.Namespace{}
	eventually(t, "the namespace to be deleted at its ttl although its request is gone", func() bool {
		return f.c.Get(ctx, client.ObjectKey{Name: "orphaned"}, ns) == nil && ns.DeletionTimestamp != nil
	}, nil)
}

// TestKubeconfigNamesThePublishedServer: without --cluster-server, handed-out kubeconfigs name the
// API server and CA the cluster publishes in kube-public/cluster-info (kubeadm's bootstrap
// kubeconfig: one cluster, no context), and the request's message says so.
//
// Not parallel: kube-public/cluster-info is the server's one, and every manager started while it
// exists names its server (NewReconciler reads it). Parallel tests run only once the others have
// ended, and it is gone by then.
func TestKubeconfigNamesThePublishedServer(t *testing.T) {
	ctx := context.Background()
	const server = "https://api.published.example:6443"
	ca := []byte("-----BEGIN CERTIFICATE-----\npublished\n-----END CERTIFICATE-----\n")
	published := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: %s\n    certificate-authority-data: %s\n",
		server, base64.StdEncoding.EncodeToString(ca))
	clusterInfo := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-public", Name: "cluster-info"},
		Data:       map[string]string{"kubeconfig": published},
	}
	must(t, env.Client.Create(ctx, clusterInfo))
	t.Cleanup(func() { must(t, env.Client.Delete(ctx, clusterInfo)) })
	f := start(t, nil)
	f.request(t, "published", nil)
	cm := f.waitStatus(t, "published", nsrequest.StatusReady)
	if msg := cm.Annotations[nsrequest.AnnotationMessage]; !strings.Contains(msg, "the kubeconfig names API server "+server+" (published in kube-public/cluster-info)") {
		t.Errorf("status message %q does not name the published server", msg)
	}
	secret := &corev1.Secret{}
	must(t, f.c.Get(ctx, client.ObjectKey{Namespace: f.rns, Name: "published"}, secret))
	kc, err := clientcmd.Load(secret.Data["kubeconfig"])
	must(t, err)
	cluster := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster]
	if cluster.Server != server || !bytes.Equal(cluster.CertificateAuthorityData, ca) || !bytes.Equal(secret.Data["ca.crt"], ca) {
		t.Errorf("kubeconfig names %s with CA %q (ca.crt %q), want the published %s and its CA", cluster.Server, cluster.CertificateAuthorityData, secret.Data["ca.crt"], server)
	}
}
