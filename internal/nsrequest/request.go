// Package nsrequest is the pure logic of the namespaces controller: it decides whether a request
// ConfigMap is acceptable, what it asks for, what the operator builds for it, and when credentials
// are due for refresh. It has no client.
package nsrequest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Labels, annotations and data keys of the ConfigMap contract (compatible with nsplease-style
// request namespaces: a ConfigMap named N asks for namespace N).
const (
	LabelManagedBy = "quartermaster.dev/managed-by"
	ManagedByValue = "quartermaster"
	LabelRequest   = "quartermaster.dev/request"
	LabelIgnore    = "quartermaster.dev/ignore"

	AnnotationStatus         = "quartermaster.dev/status"
	AnnotationMessage        = "quartermaster.dev/message"
	AnnotationReason         = "quartermaster.dev/reason"
	AnnotationRequest        = "quartermaster.dev/request"
	AnnotationRequestUID     = "quartermaster.dev/request-uid"
	AnnotationExpiresAt      = "quartermaster.dev/expires-at"
	AnnotationTokenExpiresAt = "quartermaster.dev/token-expires-at"
	AnnotationTokenIssuedAt  = "quartermaster.dev/token-issued-at"
	AnnotationTokenSAUID     = "quartermaster.dev/token-service-account-uid"

	DataTTL      = "ttl"
	DataTokenTTL = "token-ttl"

	// RootCAConfigMap is published in every namespace by the cluster; it is never a request.
	RootCAConfigMap = "kube-root-ca.crt"
)

// Status is what the request ConfigMap's quartermaster.dev/status annotation says.
type Status string

// The statuses a request can have.
const (
	StatusReady    Status = "Ready"
	StatusPending  Status = "Pending"
	StatusInvalid  Status = "Invalid"
	StatusConflict Status = "Conflict"
)

// Policy is the operator's configuration for requests.
type Policy struct {
	RequestsNamespace string
	// OperatorNamespace is never handed out.
	OperatorNamespace string
	// Deny and Allow are anchored regular expressions on the requested name; Allow empty allows all.
	Deny  []*regexp.Regexp
	Allow []*regexp.Regexp
	// TokenTTL is the default token lifetime; MaxTokenTTL caps a per-request token-ttl.
	TokenTTL    time.Duration
	MaxTokenTTL time.Duration
	// MaxTTL bounds a request's namespace ttl; zero means unbounded.
	MaxTTL time.Duration
	// CopyFrom is the namespace of the objects the defaults copy ("": none are).
	CopyFrom string
}

// MinTokenTTL is the shortest lifetime the TokenRequest API issues.
const MinTokenTTL = 10 * time.Minute

// DefaultDenyNames is the default of --deny-names: system namespaces. (Existing system namespaces
// are safe whatever the flag says: they lack the operator's labels, so requests for them conflict.)
var DefaultDenyNames = []string{"kube-.*", "default"}

// CompilePatterns anchors and compiles comma-separated regular expressions.
func CompilePatterns(list []string) ([]*regexp.Regexp, error) {
	var out []*regexp.Regexp
	for _, p := range list {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		re, err := regexp.Compile("^(?:" + p + ")$")
		if err != nil {
			return nil, fmt.Errorf("invalid pattern %q: %w", p, err)
		}
		out = append(out, re)
	}
	return out, nil
}

// Request is an accepted request.
type Request struct {
	// Namespace is the namespace asked for (the ConfigMap's name).
	Namespace string
	// TTL, when non-zero, is how long after its creation the namespace is deleted.
	TTL time.Duration
	// TokenTTL is the lifetime of the credentials handed out.
	TokenTTL time.Duration
	// Notes are adjustments the user should know about (a capped ttl, …).
	Notes []string
	// Profile is the defaults the namespace gets (Defaults.ProfileNamed of the request's
	// AnnotationDefaults), set by whoever serves the request.
	Profile *Profile
}

// Rejection explains why a request is refused; Reason is a CamelCase Event reason.
type Rejection struct {
	Reason  string
	Message string
}

// Parse validates a request ConfigMap's name and data against the policy.
func (p *Policy) Parse(name string, data map[string]string) (*Request, *Rejection) {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return nil, &Rejection{"InvalidName", fmt.Sprintf("%q is not a valid namespace name: %s", name, strings.Join(errs, "; "))}
	}
	// The copies' sources too: a tenant who got that namespace (while it does not exist) would
	// write what every namespace receives.
	if name == p.RequestsNamespace || name == p.OperatorNamespace || name == p.CopyFrom && p.CopyFrom != "" {
		return nil, &Rejection{"Denied", fmt.Sprintf("namespace %q is reserved for the operator", name)}
	}
	for _, re := range p.Deny {
		if re.MatchString(name) {
			return nil, &Rejection{"Denied", fmt.Sprintf("namespace %q is denied by the operator's --deny-names pattern %s", name, unanchor(re))}
		}
	}
	if len(p.Allow) > 0 && !matchesAny(p.Allow, name) {
		return nil, &Rejection{"NotAllowed", fmt.Sprintf("namespace %q matches none of the operator's --allow-names patterns", name)}
	}
	req := &Request{Namespace: name, TokenTTL: p.TokenTTL}
	if v, ok := data[DataTTL]; ok {
		ttl, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || ttl <= 0 {
			return nil, &Rejection{"InvalidTTL", fmt.Sprintf("data key %q must be a positive Go duration such as 72h, got %q", DataTTL, v)}
		}
		if p.MaxTTL > 0 && ttl > p.MaxTTL {
			req.Notes = append(req.Notes, fmt.Sprintf("ttl %s capped to the operator's maximum %s", ttl, p.MaxTTL))
			ttl = p.MaxTTL
		}
		req.TTL = ttl
	}
	if v, ok := data[DataTokenTTL]; ok {
		ttl, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || ttl <= 0 {
			return nil, &Rejection{"InvalidTokenTTL", fmt.Sprintf("data key %q must be a positive Go duration such as 8h, got %q", DataTokenTTL, v)}
		}
		req.TokenTTL = ttl
	}
	if p.MaxTokenTTL > 0 && req.TokenTTL > p.MaxTokenTTL {
		req.Notes = append(req.Notes, fmt.Sprintf("token-ttl %s capped to the operator's maximum %s", req.TokenTTL, p.MaxTokenTTL))
		req.TokenTTL = p.MaxTokenTTL
	}
	if req.TokenTTL < MinTokenTTL {
		req.Notes = append(req.Notes, fmt.Sprintf("token-ttl %s raised to the API server's minimum %s", req.TokenTTL, MinTokenTTL))
		req.TokenTTL = MinTokenTTL
	}
	return req, nil
}

// RequestLabel is the value of the quartermaster.dev/request label on everything made for a request:
// "<requests-namespace>.<name>", shortened with a hash when it would exceed the 63 characters a
// label value may have. The full reference is also in the quartermaster.dev/request annotation.
func RequestLabel(requestsNamespace, name string) string {
	v := requestsNamespace + "." + name
	if len(v) <= validation.LabelValueMaxLength {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	h := hex.EncodeToString(sum[:])[:10]
	return strings.TrimRight(v[:validation.LabelValueMaxLength-11], "-.") + "-" + h
}

// IsOurs reports whether labels mark an object as made by this operator for this request.
func IsOurs(labels map[string]string, requestsNamespace, name string) bool {
	return labels[LabelManagedBy] == ManagedByValue && labels[LabelRequest] == RequestLabel(requestsNamespace, name)
}

func matchesAny(res []*regexp.Regexp, s string) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

func unanchor(re *regexp.Regexp) string {
	return strings.TrimSuffix(strings.TrimPrefix(re.String(), "^(?:"), ")$")
}
