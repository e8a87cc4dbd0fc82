// Package iamemulator is an in-memory emulator of the AWS IAM Query API (plus STS
// GetCallerIdentity) for tests and demos, because no IAM emulator is reachable from the
// build machines. The real AWS SDK for Go v2 is pointed at it with BaseEndpoint.
//
// It speaks the wire protocol of real IAM: form-encoded POSTs (Action=…&Version=2010-05-08),
// SigV4-signed requests (signatures are accepted, never verified), XML responses, XML error
// bodies (<ErrorResponse><Error><Code>…), percent-encoded policy documents in responses, and
// Marker/MaxItems pagination. It covers managed policies and their versions, roles, role
// attachments (also listed per policy by ListEntitiesForPolicy), inline role policies
// (inline.go), permissions boundaries and tags, with IAM's validation, conflict and limit
// errors, and the access advisor's last-accessed jobs (access.go; uses are recorded by the tests
// through RecordAccess).
//
// It also speaks EKS's REST-JSON protocol for Pod Identity associations (eks.go): create,
// describe, update, delete and list them (one per ServiceAccount), with a target role and its
// external ID, and tag them, in the clusters Options.EKSClusters names, with EKS's errors.
//
// For assertions it counts calls per action, can inject Throttling and ServiceUnavailable
// faults at a configured rate before touching state, and serves a JSON dump of its state at
// GET /_emulator/state and a reset at POST /_emulator/reset.
package iamemulator

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// DefaultAccountID is the account the emulator serves when Options.AccountID is empty.
	DefaultAccountID = "000000000000"

	iamVersion   = "2010-05-08"
	iamNamespace = "https://iam.amazonaws.com/doc/2010-05-08/"
	stsVersion   = "2011-06-15"
	stsNamespace = "https://sts.amazonaws.com/doc/2011-06-15/"

	// StatePath serves a JSON dump of the emulator state (GET).
	StatePath = "/_emulator/state"
	// ResetPath empties the state and the call counters (POST).
	ResetPath = "/_emulator/reset"
	// FaultsPath changes fault injection at run time (POST rate=0.3&kinds=throttle,5xx).
	FaultsPath = "/_emulator/faults"

	maxRequestBody = 1 << 20
)

// FaultKind is a kind of injected failure.
type FaultKind string

const (
	// FaultThrottle answers HTTP 400 with the error code Throttling ("Rate exceeded").
	FaultThrottle FaultKind = "throttle"
	// Fault5xx answers HTTP 503 with the error code ServiceUnavailable.
	Fault5xx FaultKind = "5xx"
)

// ParseFaultKinds parses a comma-separated list of fault kinds ("throttle,5xx").
// An empty string gives both kinds.
func ParseFaultKinds(s string) ([]FaultKind, error) {
	if strings.TrimSpace(s) == "" {
		return []FaultKind{FaultThrottle, Fault5xx}, nil
	}
	var kinds []FaultKind
	for part := range strings.SplitSeq(s, ",") {
		k := FaultKind(strings.TrimSpace(part))
		switch k {
		case FaultThrottle, Fault5xx:
			if !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		default:
			return nil, fmt.Errorf("unknown fault kind %q (want throttle or 5xx)", part)
		}
	}
	return kinds, nil
}

// Options configure a Server.
type Options struct {
	// AccountID is the account in ARNs and in GetCallerIdentity; DefaultAccountID if empty.
	AccountID string
	// FailRate is the probability (0.0–1.0) that a request fails with an injected fault.
	FailRate float64
	// FailKinds are the faults to inject, chosen uniformly; both kinds if empty.
	FailKinds []FaultKind
	// Seed makes fault injection and generated IDs deterministic; 0 picks a random seed.
	Seed uint64
	// Now is the clock for CreateDate/UpdateDate; time.Now if nil.
	Now func() time.Time
	// EKSClusters are the EKS clusters whose Pod Identity associations the emulator serves;
	// requests naming another cluster fail with ResourceNotFoundException, as in EKS.
	EKSClusters []string
}

// Server is an http.Handler emulating IAM. It is safe for concurrent use.
type Server struct {
	accountID string
	now       func() time.Time

	mu        sync.Mutex
	rng       *rand.Rand
	failRate  float64
	failKinds []FaultKind
	policies  map[string]*policy // by ARN, customer-managed and AWS-managed
	roles     map[string]*role   // by lower-cased name
	clusters  []string           // EKS clusters
	// associations are EKS Pod Identity associations by ID; eksTokens maps a cluster and a
	// create request's clientRequestToken to the association it made; eksSeq orders creations.
	associations map[string]*association
	eksTokens    map[string]string
	eksSeq       int
	calls        map[string]int
	faults       map[string]int
	// Access advisor: uses by role ARN (action → last time), jobs by ID, and the jobs' behaviour.
	accesses map[string]map[string]time.Time
	jobs     map[string]*accessJob
	jobPolls int
	failJobs int
	// gates hold requests of an action until enough have arrived (Gate).
	gates map[string]*gate
}

// gate holds the requests of one action until n have arrived, then lets them all through.
type gate struct {
	n, arrived int
	open       chan struct{}
}

// New returns a Server with AWS-managed policies seeded and no customer resources.
func New(opts Options) *Server {
	s := &Server{
		accountID: opts.AccountID,
		now:       opts.Now,
		clusters:  slices.Clone(opts.EKSClusters),
	}
	if s.accountID == "" {
		s.accountID = DefaultAccountID
	}
	if s.now == nil {
		s.now = time.Now
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	s.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s.setFaultsLocked(opts.FailRate, opts.FailKinds)
	s.resetLocked()
	return s
}

// SetNow replaces the clock of creation and update dates (nil: time.Now), e.g. to make a role that
// was created long ago.
func (s *Server) SetNow(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now == nil {
		now = time.Now
	}
	s.now = now
}

// Gate makes the next n requests of action wait, unanswered, until the n-th has arrived, and then
// answers them all, in the order they take the emulator's lock: what two clients see when each reads
// and writes at the same moment (each read a document before either wrote it). The returned
// function opens the gate early (a test's cleanup, so that a request never waits forever).
func (s *Server) Gate(action string, n int) (open func()) {
	g := &gate{n: n, open: make(chan struct{})}
	s.mu.Lock()
	if s.gates == nil {
		s.gates = map[string]*gate{}
	}
	s.gates[action] = g
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.gates[action] == g {
			delete(s.gates, action)
			close(g.open)
		}
	}
}

// Waiting is how many requests of action wait at its gate.
func (s *Server) Waiting(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.gates[action]; g != nil {
		return g.arrived
	}
	return 0
}

// passGate waits at action's gate, if it has one.
func (s *Server) passGate(action string) {
	s.mu.Lock()
	g := s.gates[action]
	if g == nil {
		s.mu.Unlock()
		return
	}
	g.arrived++
	if g.arrived == g.n {
		delete(s.gates, action)
		close(g.open)
	}
	s.mu.Unlock()
	<-g.open
}

// AccountID is the account the emulator serves.
func (s *Server) AccountID() string { return s.accountID }

// SetFaults changes the fault injection rate and kinds (both kinds if kinds is empty).
func (s *Server) SetFaults(rate float64, kinds []FaultKind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setFaultsLocked(rate, kinds)
}

func (s *Server) setFaultsLocked(rate float64, kinds []FaultKind) {
	s.failRate = min(max(rate, 0), 1)
	if len(kinds) == 0 {
		kinds = []FaultKind{FaultThrottle, Fault5xx}
	}
	s.failKinds = slices.Clone(kinds)
}

// Reset deletes every customer resource (and association) and zeroes the call and fault counters.
// Fault injection settings and EKS clusters are kept.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resetLocked()
}

func (s *Server) resetLocked() {
	s.policies = map[string]*policy{}
	s.roles = map[string]*role{}
	s.associations = map[string]*association{}
	s.eksTokens = map[string]string{}
	s.calls = map[string]int{}
	s.faults = map[string]int{}
	s.accesses, s.jobs = nil, nil
	s.seedAWSManagedLocked()
}

// Calls returns how many requests for action (an IAM or STS action, or an EKS operation such as
// CreatePodIdentityAssociation) were received, including requests answered with an injected fault
// or an error.
func (s *Server) Calls(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[action]
}

// TotalCalls returns how many API requests were received for all actions.
func (s *Server) TotalCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		n += c
	}
	return n
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case StatePath:
		s.serveState(w, r)
		return
	case ResetPath:
		if r.Method != http.MethodPost {
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
		return
	case FaultsPath:
		s.serveFaults(w, r)
		return
	}
	if isEKSPath(r.URL.Path) {
		s.serveEKS(w, r)
		return
	}

	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
	if err := r.ParseForm(); err != nil {
		s.writeError(w, iamNamespace, s.newRequestID(), &apiError{
			status: http.StatusBadRequest, code: "MalformedQueryString", msg: err.Error(),
		})
		return
	}
	form := params(r.Form)
	action := form.get("Action")
	s.passGate(action)

	s.mu.Lock()
	s.calls[action]++
	requestID := s.newUUIDLocked()
	if fault := s.pickFaultLocked(); fault != nil {
		s.faults[action]++
		s.mu.Unlock()
		s.writeError(w, namespaceFor(action), requestID, fault)
		return
	}
	result, aerr := s.dispatchLocked(action, form)
	s.mu.Unlock()

	if aerr != nil {
		s.writeError(w, namespaceFor(action), requestID, aerr)
		return
	}
	writeResult(w, namespaceFor(action), action, requestID, result)
}

func namespaceFor(action string) string {
	if action == "GetCallerIdentity" {
		return stsNamespace
	}
	return iamNamespace
}

func (s *Server) pickFaultLocked() *apiError {
	if s.failRate <= 0 || s.rng.Float64() >= s.failRate {
		return nil
	}
	switch s.failKinds[s.rng.IntN(len(s.failKinds))] {
	case Fault5xx:
		return &apiError{status: http.StatusServiceUnavailable, code: "ServiceUnavailable", msg: "Service is unavailable. Please retry."}
	default:
		return &apiError{status: http.StatusBadRequest, code: "Throttling", msg: "Rate exceeded"}
	}
}

func (s *Server) dispatchLocked(action string, p params) (any, *apiError) {
	if action == "" {
		return nil, &apiError{status: http.StatusBadRequest, code: "MissingAction", msg: "Missing Action"}
	}
	if action == "GetCallerIdentity" {
		return s.getCallerIdentity(), nil
	}
	h, ok := handlers[action]
	if !ok {
		return nil, &apiError{
			status: http.StatusBadRequest, code: "InvalidAction",
			msg: fmt.Sprintf("Could not find operation %s for version %s", action, iamVersion),
		}
	}
	return h(s, p)
}

type handler func(*Server, params) (any, *apiError)

var handlers = map[string]handler{
	"CreatePolicy":                       (*Server).createPolicy,
	"GetPolicy":                          (*Server).getPolicy,
	"DeletePolicy":                       (*Server).deletePolicy,
	"ListPolicies":                       (*Server).listPolicies,
	"GetPolicyVersion":                   (*Server).getPolicyVersion,
	"ListPolicyVersions":                 (*Server).listPolicyVersions,
	"CreatePolicyVersion":                (*Server).createPolicyVersion,
	"DeletePolicyVersion":                (*Server).deletePolicyVersion,
	"SetDefaultPolicyVersion":            (*Server).setDefaultPolicyVersion,
	"TagPolicy":                          (*Server).tagPolicy,
	"UntagPolicy":                        (*Server).untagPolicy,
	"ListPolicyTags":                     (*Server).listPolicyTags,
	"ListEntitiesForPolicy":              (*Server).listEntitiesForPolicy,
	"CreateRole":                         (*Server).createRole,
	"GetRole":                            (*Server).getRole,
	"UpdateRole":                         (*Server).updateRole,
	"UpdateAssumeRolePolicy":             (*Server).updateAssumeRolePolicy,
	"PutRolePermissionsBoundary":         (*Server).putRolePermissionsBoundary,
	"DeleteRolePermissionsBoundary":      (*Server).deleteRolePermissionsBoundary,
	"DeleteRole":                         (*Server).deleteRole,
	"AttachRolePolicy":                   (*Server).attachRolePolicy,
	"DetachRolePolicy":                   (*Server).detachRolePolicy,
	"ListAttachedRolePolicies":           (*Server).listAttachedRolePolicies,
	"PutRolePolicy":                      (*Server).putRolePolicy,
	"GetRolePolicy":                      (*Server).getRolePolicy,
	"DeleteRolePolicy":                   (*Server).deleteRolePolicy,
	"ListRolePolicies":                   (*Server).listRolePolicies,
	"GenerateServiceLastAccessedDetails": (*Server).generateServiceLastAccessedDetails,
	"GetServiceLastAccessedDetails":      (*Server).getServiceLastAccessedDetails,
	"ListPoliciesGrantingServiceAccess":  (*Server).listPoliciesGrantingServiceAccess,
	"ListRoles":                          (*Server).listRoles,
	"TagRole":                            (*Server).tagRole,
	"UntagRole":                          (*Server).untagRole,
	"ListRoleTags":                       (*Server).listRoleTags,
}

// Actions lists the IAM and STS actions and EKS operations the emulator implements, sorted.
func Actions() []string {
	out := append([]string{"GetCallerIdentity"}, eksOperations...)
	for a := range handlers {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

type callerIdentityResult struct {
	Arn     string `xml:"Arn"`
	UserID  string `xml:"UserId"`
	Account string `xml:"Account"`
}

func (s *Server) getCallerIdentity() callerIdentityResult {
	return callerIdentityResult{
		Arn:     "arn:aws:iam::" + s.accountID + ":user/emulator",
		UserID:  "AIDAEMULATOREMULATOR",
		Account: s.accountID,
	}
}

func (s *Server) serveFaults(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "use POST with rate=0.3&kinds=throttle,5xx", http.StatusMethodNotAllowed)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rate, err := strconv.ParseFloat(r.Form.Get("rate"), 64)
	if err != nil || rate < 0 || rate > 1 {
		http.Error(w, "rate must be a number in [0,1]", http.StatusBadRequest)
		return
	}
	kinds, err := ParseFaultKinds(r.Form.Get("kinds"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.SetFaults(rate, kinds)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) serveState(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.State())
}

func (s *Server) newRequestID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newUUIDLocked()
}

// newUUIDLocked returns a random UUID-shaped ID (request IDs, EKS external IDs, last-accessed job IDs).
func (s *Server) newUUIDLocked() string {
	const hex = "0123456789abcdef"
	b := make([]byte, 0, 36)
	for i := range 32 {
		if i == 8 || i == 12 || i == 16 || i == 20 {
			b = append(b, '-')
		}
		b = append(b, hex[s.rng.IntN(16)])
	}
	return string(b)
}

// newIDLocked returns an IAM unique ID: a four-letter prefix and 17 upper-case alphanumerics.
func (s *Server) newIDLocked(prefix string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	b := []byte(prefix)
	for range 17 {
		b = append(b, alphabet[s.rng.IntN(len(alphabet))])
	}
	return string(b)
}

func (s *Server) timestamp() time.Time {
	return s.now().UTC().Truncate(time.Second)
}
