package mirrors

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// Ready reasons of a RegistryMirror.
const (
	ReasonReady              = "Ready"
	ReasonStarting           = "Starting"
	ReasonInvalidSpec        = "InvalidSpec"
	ReasonDuplicateHost      = registryv1alpha1.ReasonDuplicateMirrorHost
	ReasonCredentials        = "CredentialsSecretInvalid"
	ReasonUnauthorized       = "UpstreamUnauthorized"
	ReasonNameTaken          = "NameTaken"
	ReasonWaitingForEndpoint = "WaitingForEndpoint"
	// ReasonCacheFailing: a cache pod's container ended in failure and said why (its volume, most
	// often): a person acts, the pod's next status brings the next look.
	ReasonCacheFailing = "CacheFailing"
)

// Reconciler keeps each RegistryMirror's objects as its spec says.
type Reconciler struct {
	client    client.Client // RegistryMirrors, from the shared cache, never older than our writes
	objects   client.Client // the mirrors' namespaced objects, from the controller's own cache
	apiReader client.Reader
	scheme    *runtime.Scheme
	recorder  events.EventRecorder
	install   mirror.Install
	upstream  *upstreamChecker // nil: upstreams are not asked
	resync    time.Duration
	slowRetry time.Duration
	// usage is the cluster's Pods, workloads and nodes, their images and platforms alone (pins.go);
	// nil with pinning by use off.
	usage *usageCache
	now   func() time.Time
}

// step ends every reconcile (status.Step): the guarded client, the recorder.
func (r *Reconciler) step() status.Step { return status.Step{Client: r.client, Recorder: r.recorder} }

// Reconcile brings one mirror's objects to its spec and reports what they show.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	rm := &registryv1alpha1.RegistryMirror{}
	if err := r.client.Get(ctx, req.NamespacedName, rm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !rm.DeletionTimestamp.IsZero() {
		// The objects are owned: the garbage collector removes them, and the node agents remove
		// their hosts.toml once they see the mirror going.
		return reconcile.Result{}, nil
	}
	before := rm.DeepCopy()
	o, after, err := r.reconcile(ctx, rm)
	if apierrors.IsConflict(err) {
		// Someone wrote one of the mirror's objects since the cache saw it (only their updates
		// carry a resourceVersion): that write's watch event brings the next reconcile. A
		// routine race is not reported as a failure.
		return reconcile.Result{}, nil
	}
	if err != nil {
		o = status.Transient("Error", err.Error(), err)
	}
	res, err := r.step().End(ctx, rm, before, status.Reported{Conditions: &rm.Status.Conditions, ObservedGeneration: &rm.Status.ObservedGeneration}, o)
	if err == nil && after != nil {
		// After the status: the node agents read it to know their files are released.
		if err := after(ctx); err != nil {
			return reconcile.Result{}, err
		}
	}
	return res, err
}

// reconcile brings the mirror's objects to its spec. after, when not nil, is what must happen
// once the status is written.
func (r *Reconciler) reconcile(ctx context.Context, rm *registryv1alpha1.RegistryMirror) (o status.Outcome, after func(context.Context) error, err error) {
	// What the objects show is observed anew; a mirror stopped before them shows nothing.
	r.observe(rm, observed{})
	rm.Status.PinnedImages, rm.Status.PinnedSize = 0, nil
	spec, err := mirror.Resolve(rm)
	if err != nil {
		return status.WaitsForPerson(ReasonInvalidSpec, err.Error(), r.slowRetry), nil, nil
	}
	rm.Status.MirrorHost = spec.MirrorHost
	if o, after, stop, err := r.checkUnique(ctx, rm, spec); stop || err != nil {
		return o, after, err
	}
	creds, credsProblem, err := r.credentials(ctx, spec)
	if err != nil {
		return status.Outcome{}, nil, err
	}
	o, err = r.apply(ctx, rm, spec, creds, credsProblem)
	return o, nil, err
}

// apply renders and applies the mirror's objects and concludes from what they show.
func (r *Reconciler) apply(ctx context.Context, rm *registryv1alpha1.RegistryMirror, spec mirror.Spec,
	creds *mirror.Credentials, credsProblem string) (o status.Outcome, err error) {
	config, err := mirror.CacheConfig(mirror.CacheParams{UpstreamURL: spec.UpstreamURL, TTL: spec.TTL, HighWater: spec.HighWater, LowWater: spec.LowWater})
	if err != nil {
		return status.WaitsForPerson(ReasonInvalidSpec, err.Error(), r.slowRetry), nil
	}
	secret := mirror.CacheSecret(r.install, spec, config, creds)
	refused := ""
	if credsProblem == "" && r.upstream != nil {
		refused = r.upstream.check(ctx, spec.UpstreamURL, creds)
	}
	switch {
	case credsProblem != "":
		// The running cache keeps its last good credentials; a mirror that never had any waits
		// for them rather than pulling anonymously.
		kept, err := r.keepCredentials(ctx, secret, nil)
		if err != nil {
			return status.Outcome{}, err
		}
		if !kept {
			return status.WaitsForPerson(ReasonCredentials, credsProblem, r.slowRetry), nil
		}
		credsProblem += "; the cache keeps its last good credentials"
	case refused != "" && creds != nil:
		// New credentials the upstream refuses do not replace ones it still accepts.
		kept, err := r.keepCredentials(ctx, secret, func(old *mirror.Credentials) bool {
			return *old != *creds && r.upstream.check(ctx, spec.UpstreamURL, old) == ""
		})
		if err != nil {
			return status.Outcome{}, err
		}
		if kept {
			refused += "; the cache keeps its previous credentials, which the upstream accepts"
		}
	}

	pins, pinsEnd, ignored, err := r.pinned(ctx, spec)
	if err != nil {
		return status.Outcome{}, err
	}
	if len(ignored) > 0 {
		// The mirror serves; the message says what of spec.prefetch it does not do.
		defer func() {
			o.Message += fmt.Sprintf("; prefetch ignores %s: not pulled through %s", strings.Join(ignored, ", "), spec.MirrorHost)
		}()
	}
	pinsMap, err := mirror.PinsConfigMap(r.install, spec, pins)
	if err != nil {
		return status.Outcome{}, err
	}
	a := &applier{r: r, owner: rm}
	state, err := a.applyAll(ctx, spec, secret, pinsMap)
	if err != nil {
		return status.Outcome{}, err
	}
	rm.Status.PinnedImages = int32(len(pins.Images)) //nolint:gosec // a ConfigMap holds far fewer
	// Look again when a pin ends at its ttl, or a cache pod is to be asked for the pins again,
	// if that is sooner than the outcome says (a watched change may come first).
	var lookAgain time.Duration
	sooner := func(d time.Duration) {
		if d > 0 && (lookAgain == 0 || d < lookAgain) {
			lookAgain = d
		}
	}
	defer func() {
		if lookAgain > 0 && (o.RequeueAfter == 0 || lookAgain < o.RequeueAfter) {
			o.RequeueAfter = lookAgain
		}
	}()
	sooner(pinsEnd)
	if len(a.changed) > 0 {
		r.recorder.Eventf(rm, nil, corev1.EventTypeNormal, "Applied", "Apply", "%s", strings.Join(a.changed, ", "))
	}
	if a.taken != "" {
		return status.WaitsForPerson(ReasonNameTaken, a.taken, r.slowRetry), nil
	}
	r.observe(rm, state)
	pods, err := r.cachePods(ctx, spec.Name)
	if err != nil {
		return status.Outcome{}, err
	}
	pinsNow := pinsState{pinned: len(pins.Images), hash: mirror.PinsHash([]byte(pinsMap.Data[mirror.PinsFile])), pods: pods}
	r.observeWarmed(rm, pinsNow)
	askAgain, err := r.askForPins(ctx, pinsNow)
	if err != nil {
		return status.Outcome{}, err
	}
	sooner(askAgain)
	switch {
	case credsProblem != "":
		return status.WaitsForPerson(ReasonCredentials, credsProblem, r.slowRetry), nil
	case refused != "":
		return status.WaitsForPerson(ReasonUnauthorized, refused, r.slowRetry), nil
	}
	o = r.readiness(state)
	if o.Ready {
		return o, nil
	}
	// Not serving yet: a cache pod that failed says why.
	if failures := cacheFailures(pods); len(failures) > 0 {
		return status.WaitsForPerson(ReasonCacheFailing, strings.Join(failures, "; "), r.slowRetry), nil
	}
	return o, nil
}

// cacheFailures are the failures of the mirror's cache pods (mirror.CacheFailure), in name order.
func cacheFailures(pods []corev1.Pod) []string {
	var out []string
	for i := range pods {
		if f := mirror.CacheFailure(&pods[i]); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// checkUnique stops a mirror whose host an older mirror already serves. Its node agent, if it had
// one, is removed after the status says so (two agents must not write the same hosts.toml, and
// the agents release their files when their mirror's status shows it refused).
func (r *Reconciler) checkUnique(ctx context.Context, rm *registryv1alpha1.RegistryMirror, spec mirror.Spec) (status.Outcome, func(context.Context) error, bool, error) {
	list := &registryv1alpha1.RegistryMirrorList{}
	if err := r.client.List(ctx, list, client.MatchingFields{indexMirrorHost: spec.MirrorHost}); err != nil {
		return status.Outcome{}, nil, true, err
	}
	for i := range list.Items {
		other := &list.Items[i]
		if other.Name == rm.Name || !other.DeletionTimestamp.IsZero() || !olderThan(other, rm) {
			continue
		}
		msg := fmt.Sprintf("RegistryMirror %q already mirrors %s: one mirror per host (delete one of them)", other.Name, spec.MirrorHost)
		return status.WaitsForPerson(ReasonDuplicateHost, msg, r.slowRetry), r.removeAgent(rm), true, nil
	}
	return status.Outcome{}, nil, false, nil
}

// removeAgent deletes the mirror's node agent DaemonSet, if it has one.
func (r *Reconciler) removeAgent(rm *registryv1alpha1.RegistryMirror) func(context.Context) error {
	return func(ctx context.Context) error {
		ds := &appsv1.DaemonSet{}
		err := r.objects.Get(ctx, client.ObjectKey{Namespace: r.install.Namespace, Name: mirror.AgentName(rm.Name)}, ds)
		if apierrors.IsNotFound(err) || (err == nil && !metav1.IsControlledBy(ds, rm)) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := r.objects.Delete(ctx, ds); client.IgnoreNotFound(err) != nil {
			return err
		}
		r.recorder.Eventf(rm, nil, corev1.EventTypeNormal, "Applied", "Delete", "deleted DaemonSet %s: another mirror serves %s", ds.Name, rm.Status.MirrorHost)
		return nil
	}
}

// olderThan orders mirrors of one host: the first created serves it (the name breaks ties).
func olderThan(a, b *registryv1alpha1.RegistryMirror) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// credentials reads the user's credentials Secret. A problem a person must fix comes back as a
// message naming the Secret; an error is a failed read.
func (r *Reconciler) credentials(ctx context.Context, spec mirror.Spec) (*mirror.Credentials, string, error) {
	if spec.CredentialsSecret == "" {
		return nil, "", nil
	}
	ref := r.install.Namespace + "/" + spec.CredentialsSecret
	s := &corev1.Secret{}
	err := r.objects.Get(ctx, client.ObjectKey{Namespace: r.install.Namespace, Name: spec.CredentialsSecret}, s)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Sprintf("credentials Secret %s not found", ref), nil
	case err != nil:
		return nil, "", err
	case s.Labels[mirror.LabelMirror] != "":
		// A mirror's own cache Secret holds another mirror's credentials: naming it would send
		// them to this mirror's upstream.
		return nil, fmt.Sprintf("credentials Secret %s is a mirror's own Secret: name a Secret of yours", ref), nil
	}
	user, pass := s.Data[mirror.UsernameKey], s.Data[mirror.PasswordKey]
	switch {
	case len(user) == 0 && len(pass) == 0:
		return nil, fmt.Sprintf("credentials Secret %s has no %q and %q keys", ref, mirror.UsernameKey, mirror.PasswordKey), nil
	case len(user) == 0:
		return nil, fmt.Sprintf("credentials Secret %s has an empty or missing %q key", ref, mirror.UsernameKey), nil
	case len(pass) == 0:
		return nil, fmt.Sprintf("credentials Secret %s has an empty or missing %q key", ref, mirror.PasswordKey), nil
	}
	return &mirror.Credentials{Username: string(user), Password: string(pass)}, "", nil
}

// keepCredentials copies the credentials of the cache Secret in place into desired when it has
// some and keep (if not nil) agrees, and reports whether it did.
func (r *Reconciler) keepCredentials(ctx context.Context, desired *corev1.Secret, keep func(*mirror.Credentials) bool) (bool, error) {
	current := &corev1.Secret{}
	err := r.objects.Get(ctx, client.ObjectKeyFromObject(desired), current)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	user, pass := current.Data[mirror.UsernameKey], current.Data[mirror.PasswordKey]
	if len(user) == 0 || len(pass) == 0 {
		return false, nil
	}
	if keep != nil && !keep(&mirror.Credentials{Username: string(user), Password: string(pass)}) {
		return false, nil
	}
	desired.Data[mirror.UsernameKey], desired.Data[mirror.PasswordKey] = user, pass
	return true, nil
}

// observe copies what the cache and the agents report into the mirror's status.
func (r *Reconciler) observe(rm *registryv1alpha1.RegistryMirror, st observed) {
	rm.Status.Endpoint = st.endpoint
	rm.Status.ReadyReplicas = 0
	rm.Status.NodesConfigured, rm.Status.NodesDesired = 0, 0
	if st.cache != nil {
		rm.Status.ReadyReplicas = st.cache.Status.ReadyReplicas
	}
	if st.agent != nil {
		rm.Status.NodesConfigured = st.agent.Status.NumberReady
		rm.Status.NodesDesired = st.agent.Status.DesiredNumberScheduled
	}
}

// readiness is Ready when every cache pod of the current spec serves and every node it applies
// to is configured; otherwise the mirror is still starting (watches on the StatefulSet and the
// DaemonSet bring the next look).
func (r *Reconciler) readiness(st observed) status.Outcome {
	if st.endpoint == "" {
		return status.Progressing(ReasonWaitingForEndpoint, "waiting for the Service's address", 0)
	}
	sts, ds := st.cache, st.agent
	want := int32(1)
	if sts.Spec.Replicas != nil {
		want = *sts.Spec.Replicas
	}
	// A scale-down is done once the pods beyond want are gone (they count in Replicas until then).
	cacheDone := sts.Status.ObservedGeneration >= sts.Generation && sts.Status.ReadyReplicas >= want &&
		sts.Status.UpdatedReplicas >= want && sts.Status.Replicas <= want
	nodesDone := ds.Status.ObservedGeneration >= ds.Generation && ds.Status.NumberReady >= ds.Status.DesiredNumberScheduled &&
		ds.Status.UpdatedNumberScheduled >= ds.Status.DesiredNumberScheduled
	msg := fmt.Sprintf("cache %d/%d ready at %s; %d/%d nodes configured",
		sts.Status.ReadyReplicas, want, st.endpoint, ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
	if cacheDone && nodesDone {
		return status.Healthy(ReasonReady, msg, r.resync)
	}
	return status.Progressing(ReasonStarting, msg, 0)
}
