package namespaces

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	nsv1alpha1 "github.com/quartermaster-dev/quartermaster/api/namespaces/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/pipelineid"
)

// +kubebuilder:rbac:groups=namespaces.quartermaster.dev,resources=trustedissuers,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=namespace-requests,resources=configmaps,verbs=create
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=namespace-requests,resources=leases,verbs=get;list;watch;create;delete

// The keyless path (docs/namespaces.md, "Keyless pipelines"): a CI job presents its OIDC identity
// token at nsrequest.ExchangePath; the exchange verifies it against a TrustedIssuer, derives the one
// namespace its claims allow, records the token as used, and makes (or reuses) the request
// ConfigMap of that namespace as a pipeline holding a credential would, with the identity in its
// labels and annotations. The namespaces controller serves the request as any other; the exchange
// waits for its answer and returns the kubeconfig. No Kubernetes credential is stored in the CI
// system.

// Labels and annotations the exchange puts on the request ConfigMaps it makes, and on its records
// of used tokens.
const (
	// LabelIdentity is a digest of the issuer and the identity claim's value (a label value cannot
	// hold a repository's name whole): the exchange counts an identity's requests by it.
	LabelIdentity = "quartermaster.dev/identity"
	// AnnotationIdentity is "<TrustedIssuer>:<identity>", e.g. github:acme/web.
	AnnotationIdentity = "quartermaster.dev/identity"
	// AnnotationIdentityClaims are the claims the request was made with that say which job asked
	// (JSON: sub, ref, workflow, … as the token had them).
	AnnotationIdentityClaims = "quartermaster.dev/identity-claims"
	// AnnotationRequestedAt is when the exchange made the request (RFC 3339 with nanoseconds: the
	// oldest of an identity's requests is the one named when it reaches its limit).
	AnnotationRequestedAt = "quartermaster.dev/requested-at"
	// LabelUsedToken marks the Lease that records a token as exchanged (until it expires).
	LabelUsedToken = "quartermaster.dev/used-token"
)

// recordedClaims are the claims (of GitHub's and GitLab's tokens) copied into a request's
// identity-claims annotation when the token has them.
var recordedClaims = []string{
	"sub", "repository", "project_path", "ref", "ref_type", "event_name", "pipeline_source", "workflow",
	"job_workflow_ref", "environment", "run_id", "pipeline_id", "actor", "user_login",
}

const (
	maxExchangeBody = 4 << 10 // {"ttl": "...", "tokenTTL": "..."}
	exchangeWait    = 2 * time.Minute
)

// exchanger serves nsrequest.ExchangePath.
type exchanger struct {
	client    client.Client // the manager's (cached TrustedIssuers and request ConfigMaps)
	apiReader client.Reader // the handed-out Secret (the cache keeps only a summary of it)
	recorder  events.EventRecorder
	verifier  *pipelineid.Verifier
	policy    *nsrequest.Policy
	defaults  *nsrequest.Defaults
	// wait bounds how long an exchange waits for the namespace to be Ready; poll, how often it looks.
	wait, poll time.Duration
}

// refusal is an exchange that ends with an HTTP error.
type refusal struct {
	status int
	nsrequest.ExchangeError
}

func refused(status int, check, format string, args ...any) *refusal {
	return &refusal{status: status, ExchangeError: nsrequest.ExchangeError{Check: check, Message: fmt.Sprintf(format, args...)}}
}

func (e *exchanger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != nsrequest.ExchangePath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, nsrequest.ExchangeError{Check: "method", Message: "POST the token to " + nsrequest.ExchangePath})
		return
	}
	resp, ref := e.exchange(r)
	log := logf.FromContext(r.Context()).WithName("exchange")
	if ref != nil {
		log.Info("exchange refused", "check", ref.Check, "message", ref.Message, "remote", r.RemoteAddr)
		writeJSON(w, ref.status, ref.ExchangeError)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// exchange turns a job's token into its namespace's kubeconfig, or says which check refused it.
func (e *exchanger) exchange(r *http.Request) (*nsrequest.ExchangeResponse, *refusal) {
	ctx := r.Context()
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(raw) == "" {
		return nil, refused(http.StatusUnauthorized, "token", "no token: send the job's identity token as Authorization: Bearer <token>")
	}
	raw = strings.TrimSpace(raw)
	var body nsrequest.ExchangeRequest
	if b, err := io.ReadAll(io.LimitReader(r.Body, maxExchangeBody+1)); err != nil || len(b) > maxExchangeBody {
		return nil, refused(http.StatusRequestEntityTooLarge, "body", "the request body is over %d bytes", maxExchangeBody)
	} else if len(strings.TrimSpace(string(b))) > 0 {
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			return nil, refused(http.StatusBadRequest, "body", "the body must be JSON {\"ttl\": \"2h\", \"tokenTTL\": \"1h\"} (both optional): %v", err)
		}
	}

	iss, err := pipelineid.Peek(raw)
	if err != nil {
		return nil, tokenRefusal(err)
	}
	ti, ref := e.trustedIssuer(ctx, iss)
	if ref != nil {
		return nil, ref
	}
	tok, err := e.verifier.Verify(ctx, raw, ti.Spec.IssuerURL, ti.Spec.Audience)
	if err != nil {
		return nil, tokenRefusal(err)
	}
	identity, ok := tok.Claims[ti.Spec.IdentityClaim].(string)
	if !ok || identity == "" {
		return nil, refused(http.StatusForbidden, pipelineid.CheckClaims, "the token has no %s claim, which TrustedIssuer %s names as the identity", ti.Spec.IdentityClaim, ti.Name)
	}
	rules := make([]pipelineid.Rule, len(ti.Spec.Rules))
	for i, rule := range ti.Spec.Rules {
		rules[i] = pipelineid.Rule{Claims: rule.Claims, Namespace: rule.Namespace}
	}
	i, err := pipelineid.Match(tok.Claims, rules)
	if err != nil {
		return nil, tokenRefusal(fmt.Errorf("TrustedIssuer %s: %w", ti.Name, err))
	}
	rule := ti.Spec.Rules[i]
	name, err := pipelineid.NamespaceName(rule.Namespace, tok.Claims)
	if err != nil {
		return nil, tokenRefusal(fmt.Errorf("TrustedIssuer %s rule %s: %w", ti.Name, rule.Name, err))
	}
	data, ref := requestData(rule, body)
	if ref != nil {
		return nil, ref
	}
	if _, rej := e.policy.Parse(name, data); rej != nil {
		return nil, refused(http.StatusForbidden, pipelineid.CheckName, "namespace %s (rule %s of TrustedIssuer %s): %s", name, rule.Name, ti.Name, rej.Message)
	}
	if _, err := e.defaults.ProfileNamed(rule.Defaults); err != nil {
		// The platform's configuration, not the job's: the token is not used up.
		return nil, refused(http.StatusServiceUnavailable, "defaults", "TrustedIssuer %s rule %s: %v", ti.Name, rule.Name, err)
	}
	who := ti.Name + ":" + identity
	used, ref := e.markUsed(ctx, ti, tok, who)
	if ref != nil {
		return nil, ref
	}
	cm, ref := e.request(ctx, ti, rule, tok, who, name, data)
	var resp *nsrequest.ExchangeResponse
	if ref == nil {
		resp, ref = e.await(ctx, cm)
	}
	if ref != nil {
		// Nothing was handed out: the token is not used up, and the job may present it again while
		// it is valid (a namespace held, a limit reached, a namespace not ready in time). A token is
		// used once for a kubeconfig; the record only ever stands for one.
		if err := e.release(ctx, used); err == nil {
			ref.Message += "; the token is not used up: present it again (while it is valid) once this is resolved"
		}
		return nil, ref
	}
	return resp, nil
}

// release deletes the record of a token's use (that very record), once its exchange has handed out
// nothing. It is bounded and outlives the request's context (a job that gave up waiting).
func (e *exchanger) release(ctx context.Context, used *coordinationv1.Lease) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := e.client.Delete(ctx, used, client.Preconditions{UID: &used.UID})
	if err != nil {
		logf.FromContext(ctx).WithName("exchange").Error(err, "the record of a token whose exchange handed out nothing could not be deleted: the token stays used", "record", used.Name)
	}
	return client.IgnoreNotFound(err)
}

// tokenRefusal is the HTTP answer to a refused token: 401 for the token's own checks, 403 for
// claims the rules refuse, 503 when the issuer could not be reached.
func tokenRefusal(err error) *refusal {
	var r *pipelineid.Refusal
	if !errors.As(err, &r) {
		return refused(http.StatusInternalServerError, "internal", "%v", err)
	}
	status := http.StatusUnauthorized
	switch {
	case r.Unavailable:
		status = http.StatusServiceUnavailable
	case r.Check == pipelineid.CheckClaims || r.Check == pipelineid.CheckName:
		status = http.StatusForbidden
	}
	msg := err.Error()
	if m, ok := strings.CutSuffix(msg, r.Error()); ok { // the context added around the refusal first
		msg = m + r.Message
	}
	return refused(status, r.Check, "%s", msg)
}

// trustedIssuer is the TrustedIssuer whose issuerURL is the token's iss.
func (e *exchanger) trustedIssuer(ctx context.Context, iss string) (*nsv1alpha1.TrustedIssuer, *refusal) {
	var list nsv1alpha1.TrustedIssuerList
	if err := e.client.List(ctx, &list); err != nil {
		return nil, refused(http.StatusServiceUnavailable, "internal", "reading TrustedIssuers: %v", err)
	}
	// The oldest naming the issuer decides (a younger one says DuplicateIssuer in its status).
	var found *nsv1alpha1.TrustedIssuer
	for i := range list.Items {
		ti := &list.Items[i]
		if ti.Spec.IssuerURL == iss && ti.DeletionTimestamp == nil && (found == nil || precedes(ti, found)) {
			found = ti
		}
	}
	if found != nil {
		return found, nil
	}
	return nil, refused(http.StatusUnauthorized, pipelineid.CheckIssuer, "tokens of %s are not trusted here (no TrustedIssuer has that issuerURL)", iss)
}

// requestData is the request's data: the rule's ttl and token ttl, or less if the job asks.
func requestData(rule nsv1alpha1.IssuerRule, body nsrequest.ExchangeRequest) (map[string]string, *refusal) {
	data := map[string]string{}
	for _, d := range []struct {
		key, asked string
		ceiling    *metav1.Duration
	}{{nsrequest.DataTTL, body.TTL, rule.TTL}, {nsrequest.DataTokenTTL, body.TokenTTL, rule.TokenTTL}} {
		if d.asked == "" {
			if d.ceiling != nil {
				data[d.key] = d.ceiling.Duration.String()
			}
			continue
		}
		asked, err := time.ParseDuration(d.asked)
		if err != nil || asked <= 0 {
			return nil, refused(http.StatusBadRequest, "body", "%s must be a positive Go duration such as 2h, got %q", d.key, d.asked)
		}
		if d.ceiling != nil && asked > d.ceiling.Duration {
			return nil, refused(http.StatusForbidden, "body", "%s %s is more than rule %s allows (%s)", d.key, asked, rule.Name, d.ceiling.Duration)
		}
		data[d.key] = asked.String()
	}
	return data, nil
}

// identityLabel is the value of LabelIdentity for an identity of a TrustedIssuer.
func identityLabel(who string) string {
	sum := sha256.Sum256([]byte(who))
	return hex.EncodeToString(sum[:])[:40]
}

// markUsed records the token as exchanged: a Lease named after its ID, which the API server creates
// once (a second exchange of the token finds it: replay refused), returned as created. Records are
// swept once the tokens expire (sweepUsedTokens); an exchange that hands out nothing releases its
// record at once.
func (e *exchanger) markUsed(ctx context.Context, ti *nsv1alpha1.TrustedIssuer, tok *pipelineid.Verified, who string) (*coordinationv1.Lease, *refusal) {
	sum := sha256.Sum256([]byte(ti.Spec.IssuerURL + "\x00" + tok.ID))
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Namespace: e.policy.RequestsNamespace, Name: "used-token-" + hex.EncodeToString(sum[:])[:40],
		Labels:      map[string]string{LabelUsedToken: "true", nsrequest.LabelManagedBy: nsrequest.ManagedByValue},
		Annotations: map[string]string{nsrequest.AnnotationExpiresAt: tok.Expiry.UTC().Format(time.RFC3339), AnnotationIdentity: who},
	}}
	err := e.client.Create(ctx, lease)
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil, refused(http.StatusConflict, "replay", "this token was exchanged already (or its exchange is in progress); a token is used once (ask the CI system for a new one)")
	case err != nil:
		return nil, refused(http.StatusServiceUnavailable, "internal", "recording the token as used: %v", err)
	}
	return lease, nil
}

// request makes the request ConfigMap of namespace name for the identity, or finds the one it made
// before; one made by another identity, or not by the exchange, is refused. At most
// MaxNamespacesPerIdentity requests per identity.
func (e *exchanger) request(ctx context.Context, ti *nsv1alpha1.TrustedIssuer, rule nsv1alpha1.IssuerRule, tok *pipelineid.Verified, who, name string, data map[string]string) (*corev1.ConfigMap, *refusal) {
	cm := &corev1.ConfigMap{}
	err := e.client.Get(ctx, client.ObjectKey{Namespace: e.policy.RequestsNamespace, Name: name}, cm)
	switch {
	case err == nil && cm.Annotations[AnnotationIdentity] == who:
		return cm, nil // the same identity again (a job re-run): its namespace
	case err == nil && cm.Annotations[AnnotationIdentity] != "":
		return nil, refused(http.StatusForbidden, "held", "namespace %s is held by another identity (its request's %s annotation names it; a job is not told whose)", name, AnnotationIdentity)
	case err == nil:
		return nil, refused(http.StatusForbidden, "held", "namespace %s was requested by a pipeline holding a Kubernetes credential, not through a TrustedIssuer", name)
	case !apierrors.IsNotFound(err):
		return nil, refused(http.StatusServiceUnavailable, "internal", "reading request %s: %v", name, err)
	}
	label := identityLabel(who)
	if max := ti.Spec.MaxNamespacesPerIdentity; max != nil {
		var held corev1.ConfigMapList
		if err := e.client.List(ctx, &held, client.InNamespace(e.policy.RequestsNamespace), client.MatchingLabels{LabelIdentity: label}); err != nil {
			return nil, refused(http.StatusServiceUnavailable, "internal", "counting the identity's requests: %v", err)
		}
		if len(held.Items) >= int(*max) {
			oldest := slices.MinFunc(held.Items, func(a, b corev1.ConfigMap) int {
				return strings.Compare(a.Annotations[AnnotationRequestedAt], b.Annotations[AnnotationRequestedAt])
			})
			return nil, refused(http.StatusForbidden, "limit", "%s holds %d namespaces, the most TrustedIssuer %s allows; the oldest is %s (requested %s): delete its request ConfigMap, or let its ttl end",
				who, len(held.Items), ti.Name, oldest.Name, oldest.Annotations[AnnotationRequestedAt])
		}
	}
	recorded := map[string]any{}
	for _, c := range recordedClaims {
		if v, ok := tok.Claims[c]; ok {
			recorded[c] = v
		}
	}
	claims, _ := json.Marshal(recorded)
	cm = &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: e.policy.RequestsNamespace, Name: name,
			Labels: map[string]string{LabelIdentity: label},
			Annotations: map[string]string{
				AnnotationIdentity: who, AnnotationIdentityClaims: string(claims),
				// Fixed width (nine fraction digits), so that the strings sort as the times do.
				AnnotationRequestedAt: time.Now().UTC().Format("2006-01-02T15:04:05.000000000Z07:00"),
			},
		},
		Data: data,
	}
	if rule.Defaults != "" {
		cm.Annotations[nsrequest.AnnotationDefaults] = rule.Defaults
	}
	if err := e.client.Create(ctx, cm); apierrors.IsAlreadyExists(err) {
		// Made since the cache was read: by this identity's previous job, or by another.
		if err := e.apiReader.Get(ctx, client.ObjectKeyFromObject(cm), cm); err != nil {
			return nil, refused(http.StatusServiceUnavailable, "internal", "reading request %s: %v", name, err)
		}
		if cm.Annotations[AnnotationIdentity] == who {
			return cm, nil
		}
		return nil, refused(http.StatusForbidden, "held", "namespace %s is held by another identity (its request's %s annotation names it; a job is not told whose)", name, AnnotationIdentity)
	} else if err != nil {
		return nil, refused(http.StatusServiceUnavailable, "internal", "creating request %s: %v", name, err)
	}
	if max := ti.Spec.MaxNamespacesPerIdentity; max != nil {
		if ref := e.withinLimit(ctx, ti, cm, who, label, int(*max)); ref != nil {
			return nil, ref
		}
	}
	e.recorder.Eventf(cm, nil, corev1.EventTypeNormal, "Exchanged", "Exchange", "requested by %s through TrustedIssuer %s, rule %s (%s)", who, ti.Name, rule.Name, string(claims))
	return cm, nil
}

// withinLimit counts the identity's requests again, from the API server, once cm is made: the
// count before it came from the cache, and jobs of one identity exchanging at the same moment (on
// several replicas, or several workers of one) each passed it. The requests beyond the limit, in
// the order all of them agree on (requested-at, then name), withdraw: cm is deleted, with the
// namespace the controller may already have made for it, and the job refused as over its limit.
func (e *exchanger) withinLimit(ctx context.Context, ti *nsv1alpha1.TrustedIssuer, cm *corev1.ConfigMap, who, label string, max int) *refusal {
	var held corev1.ConfigMapList
	if err := e.apiReader.List(ctx, &held, client.InNamespace(e.policy.RequestsNamespace), client.MatchingLabels{LabelIdentity: label}); err != nil {
		return nil // the cached count passed; the next exchange counts again
	}
	if len(held.Items) <= max {
		return nil
	}
	slices.SortFunc(held.Items, func(a, b corev1.ConfigMap) int {
		if c := strings.Compare(a.Annotations[AnnotationRequestedAt], b.Annotations[AnnotationRequestedAt]); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	if !slices.ContainsFunc(held.Items[max:], func(h corev1.ConfigMap) bool { return h.UID == cm.UID }) {
		return nil // one of the first max: another request withdraws
	}
	if err := e.client.Delete(ctx, cm, client.Preconditions{UID: &cm.UID}); client.IgnoreNotFound(err) != nil {
		return refused(http.StatusServiceUnavailable, "internal", "withdrawing request %s over the identity's limit: %v", cm.Name, err)
	}
	ns := &corev1.Namespace{}
	if err := e.apiReader.Get(ctx, client.ObjectKey{Name: cm.Name}, ns); err == nil && ns.Annotations[nsrequest.AnnotationRequestUID] == string(cm.UID) {
		_ = e.client.Delete(ctx, ns, client.Preconditions{UID: &ns.UID})
	}
	oldest := held.Items[0]
	return refused(http.StatusForbidden, "limit", "%s holds %d namespaces, the most TrustedIssuer %s allows (another of its jobs asked at the same moment); the oldest is %s (requested %s): delete its request ConfigMap, or let its ttl end",
		who, max, ti.Name, oldest.Name, oldest.Annotations[AnnotationRequestedAt])
}

// await waits for the controller's answer to the request and returns the kubeconfig it handed out.
func (e *exchanger) await(ctx context.Context, cm *corev1.ConfigMap) (*nsrequest.ExchangeResponse, *refusal) {
	ctx, cancel := context.WithTimeout(ctx, e.wait)
	defer cancel()
	key := client.ObjectKeyFromObject(cm)
	tick := time.NewTicker(e.poll)
	defer tick.Stop()
	for {
		switch nsrequest.Status(cm.Annotations[nsrequest.AnnotationStatus]) {
		case nsrequest.StatusReady:
			secret := &corev1.Secret{}
			if err := e.apiReader.Get(ctx, key, secret); err != nil {
				return nil, refused(http.StatusServiceUnavailable, "internal", "reading the credentials of %s: %v", key.Name, err)
			}
			ns := &corev1.Namespace{}
			if err := e.client.Get(ctx, client.ObjectKey{Name: key.Name}, ns); err != nil {
				return nil, refused(http.StatusServiceUnavailable, "internal", "reading namespace %s: %v", key.Name, err)
			}
			return &nsrequest.ExchangeResponse{
				Namespace: key.Name, Kubeconfig: string(secret.Data["kubeconfig"]),
				ExpiresAt: ns.Annotations[nsrequest.AnnotationExpiresAt], TokenExpiresAt: secret.Annotations[nsrequest.AnnotationTokenExpiresAt],
			}, nil
		case nsrequest.StatusInvalid, nsrequest.StatusConflict:
			return nil, refused(http.StatusConflict, strings.ToLower(cm.Annotations[nsrequest.AnnotationStatus]), "namespace %s: %s: %s",
				key.Name, cm.Annotations[nsrequest.AnnotationReason], cm.Annotations[nsrequest.AnnotationMessage])
		}
		select {
		case <-ctx.Done():
			return nil, refused(http.StatusGatewayTimeout, "timeout", "namespace %s was not ready within %s (last status %q: %s)",
				key.Name, e.wait, cm.Annotations[nsrequest.AnnotationStatus], cm.Annotations[nsrequest.AnnotationMessage])
		case <-tick.C:
		}
		if err := e.client.Get(ctx, key, cm); err != nil && !apierrors.IsNotFound(err) {
			return nil, refused(http.StatusServiceUnavailable, "internal", "reading request %s: %v", key.Name, err)
		}
	}
}
