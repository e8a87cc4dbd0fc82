package namespaces

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// Shared objects copied into every requested namespace (defaults' copy; issue #36, after
// kubernetes/kubernetes#70147): image pull Secrets, CA bundles. The sources live in one namespace
// (--copy-from-namespace), which the manager may read (the ClusterRole
// quartermaster-namespaces-copy-source bound there), and must carry nsrequest.LabelCopySource: an
// object the defaults name by mistake (a credential of the platform's) is never copied unless
// someone marked it. The copies are written, read and removed as the namespace's own admin
// ServiceAccount (the token the controller minted for the request): the manager needs no access to
// Secrets outside its requests namespace.

// ReasonCopySource is the reason of a request waiting for a source to copy that is missing or not marked.
const ReasonCopySource = "CopySourceNotReady"

// ReasonUnknownDefaults is the reason of a request whose defaults profile (nsrequest.AnnotationDefaults)
// the operator's defaults file does not define.
const ReasonUnknownDefaults = "UnknownDefaults"

// errCopySource is a source that cannot be copied as it stands (said in the request's status).
type errCopySource struct{ msg string }

func (e *errCopySource) Error() string { return e.msg }

// ensureCopies makes the namespace's copies equal to their sources and removes the copies of
// objects the request's defaults profile no longer names. secret is the request's credentials
// (its token writes).
func (r *Reconciler) ensureCopies(ctx context.Context, req *nsrequest.Request, secret *corev1.Secret) error {
	name := req.Namespace
	if r.Policy.CopyFrom == "" {
		return nil
	}
	c, err := r.adminClient(ctx, secret)
	if err != nil {
		return err
	}
	w := owned.Writer{Client: c, Reader: c, APIReader: c}
	var missing []string
	for _, src := range sources(req.Profile.Copy) {
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: r.Policy.CopyFrom, Name: src.GetName()}, src); apierrors.IsNotFound(err) {
			missing = append(missing, fmt.Sprintf("%s %s/%s does not exist (or lacks the label %s=true)", kindOf(src), r.Policy.CopyFrom, src.GetName(), nsrequest.LabelCopySource))
			continue
		} else if err != nil {
			return err
		}
		if src.GetLabels()[nsrequest.LabelCopySource] != "true" {
			missing = append(missing, fmt.Sprintf("%s %s/%s lacks the label %s=true", kindOf(src), r.Policy.CopyFrom, src.GetName(), nsrequest.LabelCopySource))
			continue
		}
		if _, _, err := w.Ensure(ctx, nsrequest.CopyOf(r.Policy.RequestsNamespace, name, src), owned.Options{Claims: inTheRequestsNamespace}); err != nil {
			return fmt.Errorf("copying %s %s: %w", kindOf(src), src.GetName(), err)
		}
	}
	if err := r.removeDroppedCopies(ctx, c, name, req.Profile.Copy); err != nil {
		return err
	}
	if len(missing) > 0 {
		return &errCopySource{msg: "waiting to copy into the namespace: " + strings.Join(missing, "; ")}
	}
	return nil
}

// sources are empty objects of each kind and name copied.
func sources(copied nsrequest.Copies) []client.Object {
	var out []client.Object
	for _, n := range copied.Secrets {
		s := &corev1.Secret{}
		s.Name = n
		out = append(out, s)
	}
	for _, n := range copied.ConfigMaps {
		cm := &corev1.ConfigMap{}
		cm.Name = n
		out = append(out, cm)
	}
	return out
}

func kindOf(obj client.Object) string {
	if _, ok := obj.(*corev1.Secret); ok {
		return "Secret"
	}
	return "ConfigMap"
}

// removeDroppedCopies deletes the copies (LabelCopyOf) of objects copied no longer names.
func (r *Reconciler) removeDroppedCopies(ctx context.Context, c client.Client, name string, copied nsrequest.Copies) error {
	var errs []error
	var secrets corev1.SecretList
	if err := c.List(ctx, &secrets, client.InNamespace(name), client.HasLabels{nsrequest.LabelCopyOf}); err != nil {
		return err
	}
	for i := range secrets.Items {
		if s := &secrets.Items[i]; !slices.Contains(copied.Secrets, s.Name) && nsrequest.IsOurs(s.Labels, r.Policy.RequestsNamespace, name) {
			errs = append(errs, client.IgnoreNotFound(c.Delete(ctx, s)))
		}
	}
	var cms corev1.ConfigMapList
	if err := c.List(ctx, &cms, client.InNamespace(name), client.HasLabels{nsrequest.LabelCopyOf}); err != nil {
		return err
	}
	for i := range cms.Items {
		if cm := &cms.Items[i]; !slices.Contains(copied.ConfigMaps, cm.Name) && nsrequest.IsOurs(cm.Labels, r.Policy.RequestsNamespace, name) {
			errs = append(errs, client.IgnoreNotFound(c.Delete(ctx, cm)))
		}
	}
	return errors.Join(errs...)
}

// adminClient is a client acting as the requested namespace's admin ServiceAccount, with the
// token of its credentials Secret (read from the API server: the cache keeps no token).
func (r *Reconciler) adminClient(ctx context.Context, secret *corev1.Secret) (client.Client, error) {
	full := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(secret), full); err != nil {
		return nil, err
	}
	token := string(full.Data[keyToken])
	if token == "" {
		return nil, fmt.Errorf("the credentials Secret %s holds no token", secret.Name)
	}
	cfg := rest.AnonymousClientConfig(r.RestConfig)
	cfg.BearerToken = token
	// The manager's mapper: a client of its own would discover the API server's groups at each call.
	return client.New(cfg, client.Options{Scheme: r.Client.Scheme(), Mapper: r.Client.RESTMapper()})
}

// requestsOfCopySources wakes every request when a source of the copies changes.
func (r *Reconciler) requestsOfCopySources(ctx context.Context, obj client.Object) []reconcile.Request {
	if obj.GetNamespace() != r.Policy.CopyFrom {
		return nil
	}
	var list corev1.ConfigMapList
	if err := r.Client.List(ctx, &list, client.InNamespace(r.Policy.RequestsNamespace)); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, cm := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&cm)})
	}
	return out
}
