package namespaces

import (
	"context"
	"errors"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/kubeconfig"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// Keys of the credentials Secret.
const (
	keyToken      = "token"
	keyCA         = "ca.crt"
	keyNamespace  = "namespace"
	keyKubeconfig = "kubeconfig"
)

// ensureCredentials keeps the Secret named like the request, in the requests namespace, holding a
// current token of the namespace's admin ServiceAccount. The token is replaced when it is due, when
// the ServiceAccount was re-created (its old tokens stopped working), or when the server or CA to
// write changed. A nil Secret with an outcome means the request cannot proceed.
func (r *Reconciler) ensureCredentials(ctx context.Context, req *nsrequest.Request, ns *corev1.Namespace, sa *corev1.ServiceAccount) (*corev1.Secret, outcome, error) {
	rns := r.Policy.RequestsNamespace
	secret := &corev1.Secret{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: rns, Name: req.Namespace}, secret)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, outcome{}, err
	}
	if exists && !nsrequest.IsOurs(secret.Labels, rns, req.Namespace) {
		return nil, secretConflict(rns, req.Namespace), nil
	}
	now := r.Now()
	if exists && !r.credentialsStale(secret, req, sa, now) {
		return secret, outcome{}, nil
	}

	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: new(int64(req.TokenTTL.Seconds())),
	}}
	if err := r.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return nil, outcome{}, fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	config, err := kubeconfig.Render(kubeconfig.Params{
		Name: req.Namespace, Server: r.Server, CAData: r.CAData, Token: tr.Status.Token, Namespace: req.Namespace,
	})
	if err != nil {
		return nil, outcome{}, err
	}
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: rns, Name: req.Namespace, Labels: nsrequest.Labels(rns, req.Namespace),
			Annotations: map[string]string{nsrequest.AnnotationRequest: rns + "/" + req.Namespace},
		},
		Type: corev1.SecretTypeOpaque,
	}
	issued, expires, ok := nsrequest.TokenTimes(tr.Status.Token)
	if !ok { // not a JWT: fall back to our clock and the server's expiry
		issued, expires = now, tr.Status.ExpirationTimestamp.Time
	}
	want.Annotations[nsrequest.AnnotationTokenIssuedAt] = issued.UTC().Format(time.RFC3339)
	want.Annotations[nsrequest.AnnotationTokenExpiresAt] = expires.UTC().Format(time.RFC3339)
	want.Annotations[nsrequest.AnnotationTokenSAUID] = string(sa.UID)
	want.Data = map[string][]byte{
		keyToken:      []byte(tr.Status.Token),
		keyCA:         r.CAData,
		keyNamespace:  []byte(req.Namespace),
		keyKubeconfig: config,
	}
	// The namespace owns the Secret: deleting the namespace removes it even while the operator is down.
	if err := controllerutil.SetOwnerReference(ns, want, r.Client.Scheme()); err != nil {
		return nil, outcome{}, err
	}
	// Written through the one path for owned objects; the request's labels are its claim.
	// (Whether a new token is due is credentialsStale's question: the cache holds a summary of the
	// data, not the token, so the Secret is written only with a new one.)
	w := owned.Writer{Client: r.Client, Reader: r.Client, APIReader: r.APIReader}
	did, stored, err := w.Ensure(ctx, want, owned.Options{Claims: func(current client.Object) bool {
		return nsrequest.IsOurs(current.GetLabels(), rns, req.Namespace)
	}})
	switch {
	case err != nil:
		return nil, outcome{}, err
	case did == owned.Taken:
		return nil, secretConflict(rns, req.Namespace), nil
	case did == owned.Terminating:
		return nil, outcome{}, fmt.Errorf("namespace %s is being deleted", rns)
	}
	written := stored.(*corev1.Secret)
	// The first token is told by the request's Ready Event (one Event per outcome); a refresh has
	// its own.
	if did == owned.Created {
		credentialsIssued.Inc()
	} else {
		tokensRotated.Inc()
		r.Recorder.Eventf(written, nil, corev1.EventTypeNormal, "CredentialsRefreshed", "Refresh",
			"token for ServiceAccount %s/%s valid until %s", sa.Namespace, sa.Name, want.Annotations[nsrequest.AnnotationTokenExpiresAt])
	}
	return written, outcome{}, nil
}

// credentialsStale reports whether the Secret must get a new token.
func (r *Reconciler) credentialsStale(s *corev1.Secret, req *nsrequest.Request, sa *corev1.ServiceAccount, now time.Time) bool {
	c := credentialsOf(s)
	if s.Annotations[nsrequest.AnnotationTokenSAUID] != string(sa.UID) || !c.HasToken || !c.HasKubeconfig ||
		c.CADigest != digest(r.CAData) || !c.NamespaceIsName || s.Name != req.Namespace || c.Server == "" || c.Server != r.Server {
		return true
	}
	return tokenState(s).NeedsRefresh(now, req.TokenTTL, nsrequest.Jitter(req.Namespace))
}

// tokenState reads what the Secret records about its token; unreadable times read as zero.
func tokenState(s *corev1.Secret) nsrequest.TokenState {
	issued, _ := time.Parse(time.RFC3339, s.Annotations[nsrequest.AnnotationTokenIssuedAt])
	expires, _ := time.Parse(time.RFC3339, s.Annotations[nsrequest.AnnotationTokenExpiresAt])
	return nsrequest.TokenState{IssuedAt: issued, ExpiresAt: expires}
}

// checkSecretFree returns a Conflict outcome when a Secret named like the request exists in the
// requests namespace and is not the operator's. The cache holds only the operator's Secrets, so
// this reads from the API server; it runs only until the request is served.
func (r *Reconciler) checkSecretFree(ctx context.Context, name string) (*outcome, error) {
	rns := r.Policy.RequestsNamespace
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: rns, Name: name}, &corev1.Secret{}); err == nil {
		return nil, nil // ours (the cache holds only labelled Secrets)
	}
	s := &metav1.PartialObjectMetadata{}
	s.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: rns, Name: name}, s)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if nsrequest.IsOurs(s.Labels, rns, name) {
		// Ours, but not in the cache yet: writing now would mint a token only to fail.
		return nil, errCacheBehind
	}
	out := secretConflict(rns, name)
	return &out, nil
}

// errCacheBehind says the cache has not seen a write of our own yet; the reconcile is retried shortly.
var errCacheBehind = errors.New("the cache is behind the API server")

func secretConflict(rns, name string) outcome {
	return outcome{status: nsrequest.StatusConflict, reason: "SecretConflict", requeue: conflictRetry,
		message: fmt.Sprintf("Secret %s/%s exists and was not created by Quartermaster; delete or rename it to receive credentials", rns, name)}
}
