package iamemulator

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The EKS part of the emulator: the Pod Identity association operations of the EKS API, in its
// REST-JSON protocol (paths under /clusters/{name}/pod-identity-associations, JSON bodies, errors
// as an X-Amzn-Errortype header and a {"message": …} body), plus TagResource and
// ListTagsForResource on associations. The SDK and the AWS CLI reach it at the same endpoint as
// IAM: IAM's requests are form POSTs to "/", EKS's have these paths.

// DefaultRegion is the region in the ARNs of EKS resources.
const DefaultRegion = "us-east-1"

// EKS error codes, with the HTTP status EKS answers them with.
const (
	eksNotFound     = "ResourceNotFoundException"   // 404
	eksInUse        = "ResourceInUseException"      // 409
	eksInvalidParam = "InvalidParameterException"   // 400
	eksThrottling   = "ThrottlingException"         // 429
	eksUnavailable  = "ServiceUnavailableException" // 503
)

// association is an EKS Pod Identity association.
type association struct {
	id, arn, cluster, namespace, serviceAccount, roleARN string
	// targetRoleARN: EKS assumes roleARN, then this role with externalID (cross-account access).
	targetRoleARN, externalID string
	disableSessionTags        bool
	tags                      map[string]string
	created, modified         time.Time
	seq                       int // creation order, for listing
}

// eksAssociationJSON is an association as EKS answers it.
type eksAssociationJSON struct {
	ClusterName        string            `json:"clusterName"`
	Namespace          string            `json:"namespace"`
	ServiceAccount     string            `json:"serviceAccount"`
	RoleArn            string            `json:"roleArn"`
	AssociationArn     string            `json:"associationArn"`
	AssociationID      string            `json:"associationId"`
	Tags               map[string]string `json:"tags"`
	CreatedAt          float64           `json:"createdAt"`
	ModifiedAt         float64           `json:"modifiedAt"`
	DisableSessionTags bool              `json:"disableSessionTags"`
	TargetRoleArn      string            `json:"targetRoleArn,omitempty"`
	ExternalID         string            `json:"externalId,omitempty"`
}

type eksSummaryJSON struct {
	ClusterName    string `json:"clusterName"`
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
	AssociationArn string `json:"associationArn"`
	AssociationID  string `json:"associationId"`
}

func (a *association) json() eksAssociationJSON {
	tags := maps.Clone(a.tags)
	if tags == nil {
		tags = map[string]string{}
	}
	return eksAssociationJSON{
		ClusterName: a.cluster, Namespace: a.namespace, ServiceAccount: a.serviceAccount, RoleArn: a.roleARN,
		AssociationArn: a.arn, AssociationID: a.id, Tags: tags,
		CreatedAt: epoch(a.created), ModifiedAt: epoch(a.modified),
		DisableSessionTags: a.disableSessionTags, TargetRoleArn: a.targetRoleARN, ExternalID: a.externalID,
	}
}

func epoch(t time.Time) float64 { return float64(t.UnixMilli()) / 1000 }

// eksOperations are the EKS operations the emulator serves, for Actions.
var eksOperations = []string{
	"CreatePodIdentityAssociation", "DescribePodIdentityAssociation", "UpdatePodIdentityAssociation",
	"DeletePodIdentityAssociation", "ListPodIdentityAssociations", "TagResource", "ListTagsForResource",
}

// isEKSPath reports whether a request path belongs to the EKS API.
func isEKSPath(path string) bool {
	return strings.HasPrefix(path, "/clusters/") || strings.HasPrefix(path, "/tags/")
}

// eksRoute is a parsed EKS request: its operation and path parameters.
type eksRoute struct {
	op                    string
	cluster, id, resource string
}

// routeEKS maps method and path to an operation. Path segments are percent-decoded one by one (an
// ARN in /tags/{resourceArn} arrives with its slashes encoded).
func routeEKS(r *http.Request) (eksRoute, bool) {
	var segs []string
	for s := range strings.SplitSeq(strings.Trim(r.URL.EscapedPath(), "/"), "/") {
		d, err := url.PathUnescape(s)
		if err != nil {
			return eksRoute{}, false
		}
		segs = append(segs, d)
	}
	switch {
	case len(segs) == 2 && segs[0] == "tags":
		switch r.Method {
		case http.MethodPost:
			return eksRoute{op: "TagResource", resource: segs[1]}, true
		case http.MethodGet:
			return eksRoute{op: "ListTagsForResource", resource: segs[1]}, true
		}
	case len(segs) == 3 && segs[0] == "clusters" && segs[2] == "pod-identity-associations":
		switch r.Method {
		case http.MethodPost:
			return eksRoute{op: "CreatePodIdentityAssociation", cluster: segs[1]}, true
		case http.MethodGet:
			return eksRoute{op: "ListPodIdentityAssociations", cluster: segs[1]}, true
		}
	case len(segs) == 4 && segs[0] == "clusters" && segs[2] == "pod-identity-associations":
		rt := eksRoute{cluster: segs[1], id: segs[3]}
		switch r.Method {
		case http.MethodGet:
			rt.op = "DescribePodIdentityAssociation"
		case http.MethodPost:
			rt.op = "UpdatePodIdentityAssociation"
		case http.MethodDelete:
			rt.op = "DeletePodIdentityAssociation"
		default:
			return eksRoute{}, false
		}
		return rt, true
	}
	return eksRoute{}, false
}

// serveEKS answers one EKS request: counted, maybe faulted, then applied under the lock.
func (s *Server) serveEKS(w http.ResponseWriter, r *http.Request) {
	rt, ok := routeEKS(r)
	if !ok {
		writeEKSError(w, "", &apiError{status: http.StatusNotFound, code: "UnknownOperationException", msg: "no EKS operation at " + r.Method + " " + r.URL.Path})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err != nil {
		writeEKSError(w, "", &apiError{status: http.StatusBadRequest, code: eksInvalidParam, msg: err.Error()})
		return
	}
	s.mu.Lock()
	s.calls[rt.op]++
	requestID := s.newUUIDLocked()
	if fault := s.pickFaultLocked(); fault != nil {
		s.faults[rt.op]++
		s.mu.Unlock()
		writeEKSError(w, requestID, eksFault(fault))
		return
	}
	result, aerr := s.dispatchEKSLocked(rt, r.URL.Query(), body)
	s.mu.Unlock()
	if aerr != nil {
		writeEKSError(w, requestID, aerr)
		return
	}
	out, err := json.Marshal(result)
	if err != nil {
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-Requestid", requestID)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// eksFault is an injected fault in EKS's words: throttling is 429 ThrottlingException, a server
// error 503 ServiceUnavailableException.
func eksFault(f *apiError) *apiError {
	if f.status >= 500 {
		return &apiError{status: http.StatusServiceUnavailable, code: eksUnavailable, msg: "Service is unavailable. Please retry."}
	}
	return &apiError{status: http.StatusTooManyRequests, code: eksThrottling, msg: "Rate exceeded"}
}

// writeEKSError writes an error the way EKS (REST-JSON) does: the code in X-Amzn-Errortype, the
// message in the body.
func writeEKSError(w http.ResponseWriter, requestID string, e *apiError) {
	body, _ := json.Marshal(map[string]string{"message": e.msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-Errortype", e.code)
	if requestID != "" {
		w.Header().Set("X-Amzn-Requestid", requestID)
	}
	w.WriteHeader(e.status)
	_, _ = w.Write(body)
}

func invalidParam(format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, eksInvalidParam, format, args...)
}

func (s *Server) dispatchEKSLocked(rt eksRoute, q url.Values, body []byte) (any, *apiError) {
	if rt.op == "TagResource" || rt.op == "ListTagsForResource" {
		a := s.associationByARNLocked(rt.resource)
		if a == nil {
			return nil, errorf(http.StatusNotFound, eksNotFound, "Resource %s not found", rt.resource)
		}
		if rt.op == "ListTagsForResource" {
			return map[string]map[string]string{"tags": nonNil(a.tags)}, nil
		}
		var in struct {
			Tags map[string]string `json:"tags"`
		}
		if err := json.Unmarshal(body, &in); err != nil || len(in.Tags) == 0 {
			return nil, invalidParam("tags must be a non-empty map of strings")
		}
		merged := maps.Clone(nonNil(a.tags))
		maps.Copy(merged, in.Tags)
		if aerr := checkEKSTags(merged); aerr != nil {
			return nil, aerr
		}
		a.tags = merged
		return struct{}{}, nil
	}
	if !slices.Contains(s.clusters, rt.cluster) {
		return nil, errorf(http.StatusNotFound, eksNotFound, "No cluster found for name: %s.", rt.cluster)
	}
	switch rt.op {
	case "CreatePodIdentityAssociation":
		return s.createAssociationLocked(rt.cluster, body)
	case "ListPodIdentityAssociations":
		return s.listAssociationsLocked(rt.cluster, q)
	}
	a := s.associations[rt.id]
	if a == nil || a.cluster != rt.cluster {
		return nil, errorf(http.StatusNotFound, eksNotFound, "No Pod Identity Association found for cluster %s with id %s", rt.cluster, rt.id)
	}
	switch rt.op {
	case "UpdatePodIdentityAssociation":
		var in struct {
			RoleArn            *string `json:"roleArn"`
			TargetRoleArn      *string `json:"targetRoleArn"`
			DisableSessionTags *bool   `json:"disableSessionTags"`
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, invalidParam("the request body is not JSON: %v", err)
		}
		if in.RoleArn != nil {
			if aerr := s.checkRoleARN(*in.RoleArn); aerr != nil {
				return nil, aerr
			}
		}
		if in.TargetRoleArn != nil && *in.TargetRoleArn != "" {
			if aerr := s.checkRoleARN(*in.TargetRoleArn); aerr != nil {
				return nil, aerr
			}
		}
		if in.RoleArn != nil {
			a.roleARN = *in.RoleArn
		}
		if in.TargetRoleArn != nil {
			s.setTargetLocked(a, *in.TargetRoleArn)
		}
		if in.DisableSessionTags != nil {
			a.disableSessionTags = *in.DisableSessionTags
		}
		if in.RoleArn != nil || in.TargetRoleArn != nil || in.DisableSessionTags != nil {
			a.modified = s.now().UTC()
		}
	case "DeletePodIdentityAssociation":
		delete(s.associations, a.id)
	}
	return map[string]eksAssociationJSON{"association": a.json()}, nil
}

var (
	// roleARNRE is an IAM role ARN (EKS refuses anything else as roleArn).
	roleARNRE = regexp.MustCompile(`^arn:aws[a-z-]*:iam::[0-9]{12}:role/[\w+=,.@/-]+$`)
	// k8sNameRE is a Kubernetes namespace or ServiceAccount name (DNS subdomain).
	k8sNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func (s *Server) checkRoleARN(arn string) *apiError {
	if !roleARNRE.MatchString(arn) {
		return invalidParam("Role ARN %s is not a valid IAM role ARN", arn)
	}
	return nil
}

// setTargetLocked sets an association's target role ("" removes it). A new target gets a new
// external ID, the one its trust policy must require; the same target keeps its ID. (EKS documents
// the ID as the association's for a target role; whether it survives a change of target it does not
// say, so the emulator makes the stricter choice: a trust policy written for one target never
// admits the next.)
func (s *Server) setTargetLocked(a *association, target string) {
	if target == a.targetRoleARN {
		return
	}
	a.targetRoleARN, a.externalID = target, ""
	if target != "" {
		a.externalID = s.newUUIDLocked()
	}
}

func checkEKSTags(tags map[string]string) *apiError {
	if len(tags) > 50 {
		return invalidParam("a resource can have at most 50 tags")
	}
	for k, v := range tags {
		if k == "" || len(k) > maxTagKeyLen || len(v) > maxTagValueLen || strings.HasPrefix(strings.ToLower(k), "aws:") {
			return invalidParam("tag %q=%q is invalid (keys 1-128 characters, not aws:, values at most 256)", k, v)
		}
	}
	return nil
}

func (s *Server) createAssociationLocked(cluster string, body []byte) (any, *apiError) {
	var in struct {
		Namespace          string            `json:"namespace"`
		ServiceAccount     string            `json:"serviceAccount"`
		RoleArn            string            `json:"roleArn"`
		TargetRoleArn      string            `json:"targetRoleArn"`
		DisableSessionTags bool              `json:"disableSessionTags"`
		ClientRequestToken string            `json:"clientRequestToken"`
		Tags               map[string]string `json:"tags"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, invalidParam("the request body is not JSON: %v", err)
	}
	for field, v := range map[string]string{"namespace": in.Namespace, "serviceAccount": in.ServiceAccount} {
		if len(v) > 253 || !k8sNameRE.MatchString(v) {
			return nil, invalidParam("%s %q is not a valid Kubernetes name", field, v)
		}
	}
	if aerr := s.checkRoleARN(in.RoleArn); aerr != nil {
		return nil, aerr
	}
	if in.TargetRoleArn != "" {
		if aerr := s.checkRoleARN(in.TargetRoleArn); aerr != nil {
			return nil, aerr
		}
	}
	if aerr := checkEKSTags(in.Tags); aerr != nil {
		return nil, aerr
	}
	// The same token again (a retry whose first answer was lost) gets the association it made.
	tokenKey := cluster + "\x00" + in.ClientRequestToken
	if id, ok := s.eksTokens[tokenKey]; ok && in.ClientRequestToken != "" {
		if a := s.associations[id]; a != nil && a.namespace == in.Namespace && a.serviceAccount == in.ServiceAccount && a.roleARN == in.RoleArn {
			return map[string]eksAssociationJSON{"association": a.json()}, nil
		}
	}
	for _, a := range s.associations {
		if a.cluster == cluster && a.namespace == in.Namespace && a.serviceAccount == in.ServiceAccount {
			return nil, errorf(http.StatusConflict, eksInUse, "Association already exists: %s", a.id)
		}
	}
	now := s.now().UTC()
	s.eksSeq++
	a := &association{
		id: s.newAssociationIDLocked(), cluster: cluster, namespace: in.Namespace, serviceAccount: in.ServiceAccount,
		roleARN: in.RoleArn, tags: maps.Clone(in.Tags), created: now, modified: now, seq: s.eksSeq,
		disableSessionTags: in.DisableSessionTags,
	}
	s.setTargetLocked(a, in.TargetRoleArn)
	a.arn = fmt.Sprintf("arn:aws:eks:%s:%s:podidentityassociation/%s/%s", DefaultRegion, s.accountID, cluster, a.id)
	s.associations[a.id] = a
	if in.ClientRequestToken != "" {
		s.eksTokens[tokenKey] = a.id
	}
	return map[string]eksAssociationJSON{"association": a.json()}, nil
}

// listAssociationsLocked answers ListPodIdentityAssociations: filtered by namespace and
// serviceAccount, in creation order, maxResults (1–100, default 100) per page, nextToken an opaque
// position.
func (s *Server) listAssociationsLocked(cluster string, q url.Values) (any, *apiError) {
	limit := 100
	if v := q.Get("maxResults"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return nil, invalidParam("maxResults must be between 1 and 100, got %s", v)
		}
		limit = n
	}
	after := 0
	if tok := q.Get("nextToken"); tok != "" {
		n, err := decodeEKSToken(tok)
		if err != nil {
			return nil, invalidParam("The nextToken is invalid")
		}
		after = n
	}
	var matching []*association
	for _, a := range s.associations {
		if a.cluster == cluster && a.seq > after &&
			(q.Get("namespace") == "" || a.namespace == q.Get("namespace")) &&
			(q.Get("serviceAccount") == "" || a.serviceAccount == q.Get("serviceAccount")) {
			matching = append(matching, a)
		}
	}
	slices.SortFunc(matching, func(a, b *association) int { return a.seq - b.seq })
	out := struct {
		Associations []eksSummaryJSON `json:"associations"`
		NextToken    string           `json:"nextToken,omitempty"`
	}{Associations: []eksSummaryJSON{}}
	for i, a := range matching {
		if i == limit {
			out.NextToken = encodeEKSToken(matching[i-1].seq)
			break
		}
		out.Associations = append(out.Associations, eksSummaryJSON{
			ClusterName: a.cluster, Namespace: a.namespace, ServiceAccount: a.serviceAccount, AssociationArn: a.arn, AssociationID: a.id,
		})
	}
	return out, nil
}

func encodeEKSToken(seq int) string {
	return base64.RawURLEncoding.EncodeToString([]byte("after:" + strconv.Itoa(seq)))
}

func decodeEKSToken(tok string) (int, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, err
	}
	n, ok := strings.CutPrefix(string(b), "after:")
	if !ok {
		return 0, errors.New("not a token of ours")
	}
	return strconv.Atoi(n)
}

func (s *Server) associationByARNLocked(arn string) *association {
	for _, a := range s.associations {
		if a.arn == arn {
			return a
		}
	}
	return nil
}

// newAssociationIDLocked returns an association ID like EKS's: "a-" and 17 lower-case
// alphanumerics.
func (s *Server) newAssociationIDLocked() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := []byte("a-")
	for range 17 {
		b = append(b, alphabet[s.rng.IntN(len(alphabet))])
	}
	return string(b)
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// AssociationState is a Pod Identity association in a State.
type AssociationState struct {
	ID             string            `json:"associationId"`
	Arn            string            `json:"associationArn"`
	Cluster        string            `json:"clusterName"`
	Namespace      string            `json:"namespace"`
	ServiceAccount string            `json:"serviceAccount"`
	RoleArn        string            `json:"roleArn"`
	Tags           map[string]string `json:"tags,omitempty"`
	// TargetRoleArn, ExternalID, DisableSessionTags: cross-account access (EKS, June 2025).
	TargetRoleArn      string `json:"targetRoleArn,omitempty"`
	ExternalID         string `json:"externalId,omitempty"`
	DisableSessionTags bool   `json:"disableSessionTags,omitempty"`
}

func (s *Server) associationStatesLocked() []AssociationState {
	out := []AssociationState{}
	for _, a := range s.associations {
		out = append(out, AssociationState{ID: a.id, Arn: a.arn, Cluster: a.cluster, Namespace: a.namespace,
			ServiceAccount: a.serviceAccount, RoleArn: a.roleARN, Tags: maps.Clone(a.tags),
			TargetRoleArn: a.targetRoleARN, ExternalID: a.externalID, DisableSessionTags: a.disableSessionTags})
	}
	slices.SortFunc(out, func(a, b AssociationState) int { return strings.Compare(a.Arn, b.Arn) })
	return out
}
