package iamemulator

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Access advisor: IAM records when each service (and, for some services, each action) was last
// used by a role; GenerateServiceLastAccessedDetails starts a job that reports it for the services
// the role's policies grant, GetServiceLastAccessedDetails polls it, and
// ListPoliciesGrantingServiceAccess says which of the role's policies grant each service. The
// emulator records uses through RecordAccess (its tests play the role's callers) and completes a
// job after JobPolls polls, or fails the ones FailJobs asks for.

// trackedNamespaces are services whose actions IAM reports one by one (action-level last accessed
// information; IAM tracks more services than these).
var trackedNamespaces = map[string]string{
	"s3": "Amazon S3", "ec2": "Amazon EC2", "iam": "AWS Identity and Access Management", "lambda": "AWS Lambda",
}

var serviceNames = map[string]string{
	"sqs": "Amazon SQS", "sns": "Amazon SNS", "dynamodb": "Amazon DynamoDB", "logs": "Amazon CloudWatch Logs",
	"kms": "AWS Key Management Service", "sts": "AWS Security Token Service", "secretsmanager": "AWS Secrets Manager",
}

func serviceName(ns string) string {
	if n, ok := trackedNamespaces[ns]; ok {
		return n
	}
	if n, ok := serviceNames[ns]; ok {
		return n
	}
	return ns
}

// accessJob is a GenerateServiceLastAccessedDetails job.
type accessJob struct {
	arn, granularity string
	created          time.Time
	pollsLeft        int
	fail             bool
}

// RecordAccess records that the role used action ("s3:GetObject") at a time, as IAM's access
// advisor does for authenticated requests.
func (s *Server) RecordAccess(roleARN, action string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.accesses == nil {
		s.accesses = map[string]map[string]time.Time{}
	}
	if s.accesses[roleARN] == nil {
		s.accesses[roleARN] = map[string]time.Time{}
	}
	if at.After(s.accesses[roleARN][action]) {
		s.accesses[roleARN][action] = at
	}
}

// SetJobPolls sets how many polls of a new job answer IN_PROGRESS before it completes (default 1).
func (s *Server) SetJobPolls(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jobPolls = n
}

// FailJobs makes the next n jobs end FAILED.
func (s *Server) FailJobs(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failJobs = n
}

func (s *Server) roleByARNLocked(arn string) *role {
	for _, r := range s.roles {
		if r.arn == arn {
			return r
		}
	}
	return nil
}

// grantingPolicy is one of a role's policies, with its document.
type grantingPolicy struct {
	name, arn, kind string // kind: MANAGED or INLINE
	document        string
}

func (s *Server) rolePoliciesLocked(r *role) []grantingPolicy {
	var out []grantingPolicy
	for _, arn := range r.attached {
		if pol := s.policies[arn]; pol != nil {
			doc := ""
			for _, v := range pol.versions {
				if v.id == pol.defaultVersion {
					doc = v.document
				}
			}
			out = append(out, grantingPolicy{name: pol.name, arn: pol.arn, kind: "MANAGED", document: doc})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(r.inline)) {
		out = append(out, grantingPolicy{name: name, kind: "INLINE", document: r.inline[name]})
	}
	return out
}

// allowedActions are the actions a document's Allow statements name, as written (NotAction
// statements are left out).
func allowedActions(doc string) []string {
	var d struct {
		Statement json.RawMessage
	}
	if json.Unmarshal([]byte(doc), &d) != nil {
		return nil
	}
	var sts []struct {
		Effect string
		Action json.RawMessage
	}
	if json.Unmarshal(d.Statement, &sts) != nil {
		var one struct {
			Effect string
			Action json.RawMessage
		}
		if json.Unmarshal(d.Statement, &one) != nil {
			return nil
		}
		sts = append(sts, one)
	}
	var out []string
	for _, st := range sts {
		if st.Effect != "Allow" {
			continue
		}
		out = append(out, stringsOf(st.Action)...)
	}
	return out
}

// grantedNamespaces are the services a role's policies grant, from their actions' prefixes.
func grantedNamespaces(pols []grantingPolicy) map[string][]string {
	out := map[string][]string{} // namespace → explicit actions granted (no wildcard)
	for _, p := range pols {
		for _, a := range allowedActions(p.document) {
			ns, act, ok := strings.Cut(a, ":")
			if !ok {
				continue // "*": every service; reported only where used
			}
			ns = strings.ToLower(ns)
			if _, seen := out[ns]; !seen {
				out[ns] = nil
			}
			if !strings.ContainsAny(act, "*?") && !slices.Contains(out[ns], a) {
				out[ns] = append(out[ns], a)
			}
		}
	}
	return out
}

func grants(p grantingPolicy, ns string) bool {
	for _, a := range allowedActions(p.document) {
		if a == "*" || strings.HasPrefix(strings.ToLower(a), ns+":") {
			return true
		}
	}
	return false
}

type generateResult struct {
	JobID string `xml:"JobId"`
}

func (s *Server) generateServiceLastAccessedDetails(p params) (any, *apiError) {
	arn, err := p.required("Arn")
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(arn, "arn:") {
		return nil, invalidInput("ARN %s is not valid.", arn)
	}
	if s.roleByARNLocked(arn) == nil {
		return nil, noSuchEntity("The role with ARN %s cannot be found.", arn)
	}
	g := p.get("Granularity")
	if g == "" {
		g = "SERVICE_LEVEL"
	}
	if g != "SERVICE_LEVEL" && g != "ACTION_LEVEL" {
		return nil, validationError("1 validation error detected: Value '%s' at 'granularity' failed to satisfy constraint: Member must satisfy enum value set: [SERVICE_LEVEL, ACTION_LEVEL]", g)
	}
	if s.jobs == nil {
		s.jobs = map[string]*accessJob{}
	}
	id := s.newUUIDLocked()
	polls := s.jobPolls
	if polls == 0 {
		polls = 1
	}
	s.jobs[id] = &accessJob{arn: arn, granularity: g, created: s.timestamp(), pollsLeft: polls, fail: s.failJobs > 0}
	if s.failJobs > 0 {
		s.failJobs--
	}
	return generateResult{JobID: id}, nil
}

type xmlTrackedAction struct {
	ActionName       string `xml:"ActionName"`
	LastAccessedTime string `xml:"LastAccessedTime,omitempty"`
	LastAccessedEnt  string `xml:"LastAccessedEntity,omitempty"`
}

type xmlServiceLastAccessed struct {
	ServiceName                string          `xml:"ServiceName"`
	ServiceNamespace           string          `xml:"ServiceNamespace"`
	LastAuthenticated          string          `xml:"LastAuthenticated,omitempty"`
	LastAuthenticatedEntity    string          `xml:"LastAuthenticatedEntity,omitempty"`
	TotalAuthenticatedEntities *int            `xml:"TotalAuthenticatedEntities,omitempty"`
	TrackedActionsLastAccessed *xmlTrackedList `xml:"TrackedActionsLastAccessed,omitempty"`
}

// xmlTrackedList is present only for tracked services at action level, as in IAM's answers.
type xmlTrackedList struct {
	Members []xmlTrackedAction `xml:"member"`
}

type xmlErrorDetails struct {
	Message string `xml:"Message"`
	Code    string `xml:"Code"`
}

type getServiceLastAccessedResult struct {
	JobStatus            string                   `xml:"JobStatus"`
	JobType              string                   `xml:"JobType"`
	JobCreationDate      string                   `xml:"JobCreationDate"`
	JobCompletionDate    string                   `xml:"JobCompletionDate,omitempty"`
	ServicesLastAccessed []xmlServiceLastAccessed `xml:"ServicesLastAccessed>member"`
	Error                *xmlErrorDetails         `xml:"Error,omitempty"`
	page
}

func (s *Server) getServiceLastAccessedDetails(p params) (any, *apiError) {
	id, err := p.required("JobId")
	if err != nil {
		return nil, err
	}
	job := s.jobs[id]
	if job == nil {
		// The emulator's answer to an unknown job; IAM's exact code for it is not documented.
		return nil, noSuchEntity("No job found with ID %s.", id)
	}
	out := getServiceLastAccessedResult{JobType: job.granularity, JobCreationDate: formatTime(job.created), ServicesLastAccessed: []xmlServiceLastAccessed{}}
	if job.pollsLeft > 0 {
		job.pollsLeft--
		out.JobStatus = "IN_PROGRESS"
		return out, nil
	}
	out.JobCompletionDate = formatTime(job.created)
	if job.fail {
		out.JobStatus = "FAILED"
		out.Error = &xmlErrorDetails{Code: "ServiceFailure", Message: "The job could not be completed."}
		return out, nil
	}
	out.JobStatus = "COMPLETED"
	var entries []xmlServiceLastAccessed
	if r := s.roleByARNLocked(job.arn); r != nil {
		used := s.accesses[job.arn]
		granted := grantedNamespaces(s.rolePoliciesLocked(r))
		for a := range used { // "*" grants every service: the used ones show
			ns, _, _ := strings.Cut(a, ":")
			ns = strings.ToLower(ns)
			if _, ok := granted[ns]; !ok && slices.ContainsFunc(s.rolePoliciesLocked(r), func(gp grantingPolicy) bool { return grants(gp, ns) }) {
				granted[ns] = nil
			}
		}
		for _, ns := range slices.Sorted(maps.Keys(granted)) {
			e := xmlServiceLastAccessed{ServiceName: serviceName(ns), ServiceNamespace: ns}
			var last time.Time
			for a, at := range used {
				if strings.HasPrefix(strings.ToLower(a), ns+":") && at.After(last) {
					last = at
				}
			}
			if !last.IsZero() {
				one := 1
				e.LastAuthenticated, e.LastAuthenticatedEntity, e.TotalAuthenticatedEntities = formatTime(last), job.arn, &one
			}
			if _, tracked := trackedNamespaces[ns]; tracked && job.granularity == "ACTION_LEVEL" {
				actions := slices.Clone(granted[ns])
				for a := range used {
					if strings.HasPrefix(strings.ToLower(a), ns+":") && !slices.Contains(actions, a) {
						actions = append(actions, a)
					}
				}
				slices.Sort(actions)
				e.TrackedActionsLastAccessed = &xmlTrackedList{}
				for _, a := range actions {
					ta := xmlTrackedAction{ActionName: a[len(ns)+1:]}
					if at, ok := used[a]; ok {
						ta.LastAccessedTime, ta.LastAccessedEnt = formatTime(at), job.arn
					}
					e.TrackedActionsLastAccessed.Members = append(e.TrackedActionsLastAccessed.Members, ta)
				}
			}
			entries = append(entries, e)
		}
	}
	pageItems, pg, aerr := paginate(p, entries, func(e xmlServiceLastAccessed) string { return e.ServiceNamespace })
	if aerr != nil {
		return nil, aerr
	}
	out.ServicesLastAccessed, out.page = pageItems, pg
	if out.ServicesLastAccessed == nil {
		out.ServicesLastAccessed = []xmlServiceLastAccessed{}
	}
	return out, nil
}

type xmlPolicyGranting struct {
	PolicyName string `xml:"PolicyName"`
	PolicyType string `xml:"PolicyType"`
	PolicyArn  string `xml:"PolicyArn,omitempty"`
	EntityType string `xml:"EntityType,omitempty"`
	EntityName string `xml:"EntityName,omitempty"`
}

type xmlGrantingEntry struct {
	ServiceNamespace string              `xml:"ServiceNamespace"`
	Policies         []xmlPolicyGranting `xml:"Policies>member"`
}

type listPoliciesGrantingResult struct {
	PoliciesGrantingServiceAccess []xmlGrantingEntry `xml:"PoliciesGrantingServiceAccess>member"`
	page
}

func (s *Server) listPoliciesGrantingServiceAccess(p params) (any, *apiError) {
	arn, err := p.required("Arn")
	if err != nil {
		return nil, err
	}
	r := s.roleByARNLocked(arn)
	if r == nil {
		return nil, noSuchEntity("The role with ARN %s cannot be found.", arn)
	}
	var namespaces []string
	for i := 1; p.has("ServiceNamespaces.member." + strconv.Itoa(i)); i++ {
		namespaces = append(namespaces, p.get("ServiceNamespaces.member."+strconv.Itoa(i)))
	}
	if len(namespaces) == 0 || len(namespaces) > 200 {
		return nil, validationError("1 validation error detected: Value at 'serviceNamespaces' failed to satisfy constraint: Member must have length between 1 and 200")
	}
	out := listPoliciesGrantingResult{}
	pols := s.rolePoliciesLocked(r)
	for _, ns := range namespaces {
		e := xmlGrantingEntry{ServiceNamespace: ns, Policies: []xmlPolicyGranting{}}
		for _, gp := range pols {
			if !grants(gp, ns) {
				continue
			}
			pg := xmlPolicyGranting{PolicyName: gp.name, PolicyType: gp.kind, PolicyArn: gp.arn}
			if gp.kind == "INLINE" {
				pg.EntityType, pg.EntityName = "ROLE", r.name
			}
			e.Policies = append(e.Policies, pg)
		}
		out.PoliciesGrantingServiceAccess = append(out.PoliciesGrantingServiceAccess, e)
	}
	return out, nil
}
