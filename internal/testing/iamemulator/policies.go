package iamemulator

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	maxPolicyVersions = 5
	policySizeQuota   = 6144
)

type policyVersion struct {
	id       string
	document string
	created  time.Time
}

type policy struct {
	arn            string
	name           string
	id             string
	path           string
	description    string
	awsManaged     bool
	created        time.Time
	updated        time.Time
	defaultVersion string
	versions       []*policyVersion // in creation order
	nextVersion    int
	tags           []Tag
}

func (p *policy) version(id string) *policyVersion {
	for _, v := range p.versions {
		if v.id == id {
			return v
		}
	}
	return nil
}

// awsManagedPolicies are seeded so that attaching well-known AWS-managed ARNs works.
var awsManagedPolicies = []struct{ path, name string }{
	{"/", "AdministratorAccess"},
	{"/", "PowerUserAccess"},
	{"/", "ReadOnlyAccess"},
	{"/", "AmazonS3ReadOnlyAccess"},
	{"/", "AmazonS3FullAccess"},
	{"/", "AmazonDynamoDBReadOnlyAccess"},
	{"/", "CloudWatchAgentServerPolicy"},
	{"/service-role/", "AmazonEBSCSIDriverPolicy"},
	{"/", "AmazonEKSClusterPolicy"},
	{"/", "AmazonEKSWorkerNodePolicy"},
}

const awsManagedDocument = `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}`

func (s *Server) seedAWSManagedLocked() {
	created := time.Date(2015, 2, 6, 18, 39, 46, 0, time.UTC)
	for i, m := range awsManagedPolicies {
		arn := "arn:aws:iam::aws:policy" + m.path + m.name
		s.policies[arn] = &policy{
			arn: arn, name: m.name, path: m.path, awsManaged: true,
			id:      "ANPAAWSMANAGED" + strconv.Itoa(1000+i) + "XYZ",
			created: created, updated: created,
			defaultVersion: "v1", nextVersion: 2,
			versions: []*policyVersion{{id: "v1", document: awsManagedDocument, created: created}},
		}
	}
}

func (s *Server) policyARN(path, name string) string {
	return "arn:aws:iam::" + s.accountID + ":policy" + path + name
}

func (s *Server) lookupPolicyLocked(p params) (*policy, *apiError) {
	arn, err := p.required("PolicyArn")
	if err != nil {
		return nil, err
	}
	pol, ok := s.policies[arn]
	if !ok {
		return nil, noSuchEntity("Policy %s does not exist or is not attachable.", arn)
	}
	return pol, nil
}

// lookupMutablePolicyLocked also refuses changes to AWS-managed policies, as IAM does.
func (s *Server) lookupMutablePolicyLocked(p params, action string) (*policy, *apiError) {
	pol, err := s.lookupPolicyLocked(p)
	if err != nil {
		return nil, err
	}
	if pol.awsManaged {
		return nil, accessDenied(s.accountID, action, pol.arn)
	}
	return pol, nil
}

func (s *Server) usageLocked(arn string) (attachments, boundaries int) {
	for _, r := range s.roles {
		if slices.Contains(r.attached, arn) {
			attachments++
		}
		if r.boundary == arn {
			boundaries++
		}
	}
	return attachments, boundaries
}

type xmlPolicy struct {
	PolicyName                    string `xml:"PolicyName"`
	PolicyID                      string `xml:"PolicyId"`
	Arn                           string `xml:"Arn"`
	Path                          string `xml:"Path"`
	DefaultVersionID              string `xml:"DefaultVersionId"`
	AttachmentCount               int    `xml:"AttachmentCount"`
	PermissionsBoundaryUsageCount int    `xml:"PermissionsBoundaryUsageCount"`
	IsAttachable                  bool   `xml:"IsAttachable"`
	Description                   string `xml:"Description,omitempty"`
	CreateDate                    string `xml:"CreateDate"`
	UpdateDate                    string `xml:"UpdateDate"`
	Tags                          []Tag  `xml:"Tags>member,omitempty"`
}

// policyView renders a policy; listings (detail=false) omit Description and Tags like IAM.
func (s *Server) policyView(pol *policy, detail bool) xmlPolicy {
	att, pb := s.usageLocked(pol.arn)
	v := xmlPolicy{
		PolicyName: pol.name, PolicyID: pol.id, Arn: pol.arn, Path: pol.path,
		DefaultVersionID: pol.defaultVersion, AttachmentCount: att, PermissionsBoundaryUsageCount: pb,
		IsAttachable: true, CreateDate: formatTime(pol.created), UpdateDate: formatTime(pol.updated),
	}
	if detail {
		v.Description = pol.description
		v.Tags = slices.Clone(pol.tags)
	}
	return v
}

type xmlPolicyVersion struct {
	Document         string `xml:"Document,omitempty"`
	VersionID        string `xml:"VersionId"`
	IsDefaultVersion bool   `xml:"IsDefaultVersion"`
	CreateDate       string `xml:"CreateDate"`
}

func versionView(pol *policy, v *policyVersion, withDocument bool) xmlPolicyVersion {
	out := xmlPolicyVersion{VersionID: v.id, IsDefaultVersion: v.id == pol.defaultVersion, CreateDate: formatTime(v.created)}
	if withDocument {
		out.Document = encodeDocument(v.document)
	}
	return out
}

type policyResult struct {
	Policy xmlPolicy `xml:"Policy"`
}

func (s *Server) createPolicy(p params) (any, *apiError) {
	in, err := p.newEntity("PolicyName", maxPolicyNameLen, "PolicyDocument", identityPolicy, "PolicySize", policySizeQuota)
	if err != nil {
		return nil, err
	}
	name, path, doc, desc := in.name, in.path, in.document, in.description
	tags, err := p.tags()
	if err != nil {
		return nil, err
	}
	for _, other := range s.policies {
		if !other.awsManaged && strings.EqualFold(other.name, name) {
			return nil, alreadyExists("A policy called %s already exists. Duplicate names are not allowed.", name)
		}
	}
	now := s.timestamp()
	pol := &policy{
		arn: s.policyARN(path, name), name: name, id: s.newIDLocked("ANPA"), path: path,
		description: desc, created: now, updated: now, defaultVersion: "v1", nextVersion: 2,
		versions: []*policyVersion{{id: "v1", document: doc, created: now}},
		tags:     tags,
	}
	s.policies[pol.arn] = pol
	return policyResult{Policy: s.policyView(pol, true)}, nil
}

func (s *Server) getPolicy(p params) (any, *apiError) {
	pol, err := s.lookupPolicyLocked(p)
	if err != nil {
		return nil, err
	}
	return policyResult{Policy: s.policyView(pol, true)}, nil
}

func (s *Server) deletePolicy(p params) (any, *apiError) {
	pol, err := s.lookupMutablePolicyLocked(p, "DeletePolicy")
	if err != nil {
		return nil, err
	}
	if att, _ := s.usageLocked(pol.arn); att > 0 {
		return nil, deleteConflict("Cannot delete a policy attached to entities.")
	}
	if len(pol.versions) > 1 {
		return nil, deleteConflict("This policy has more than one version. Before you delete a policy, you must delete the policy's versions. The default version is deleted with the policy.")
	}
	delete(s.policies, pol.arn)
	return nil, nil
}

type listPoliciesResult struct {
	Policies []xmlPolicy `xml:"Policies>member"`
	page
}

func (s *Server) listPolicies(p params) (any, *apiError) {
	scope := p.get("Scope")
	if scope == "" {
		scope = "All"
	}
	if scope != "All" && scope != "AWS" && scope != "Local" {
		return nil, validationError("1 validation error detected: Value '%s' at 'scope' failed to satisfy constraint: Member must satisfy enum value set: [All, AWS, Local]", scope)
	}
	prefix, err := p.path("PathPrefix")
	if err != nil {
		return nil, err
	}
	onlyAttached := p.boolean("OnlyAttached")
	var items []*policy
	for _, pol := range s.policies {
		if (scope == "Local" && pol.awsManaged) || (scope == "AWS" && !pol.awsManaged) {
			continue
		}
		if !strings.HasPrefix(pol.path, prefix) {
			continue
		}
		if onlyAttached {
			if att, _ := s.usageLocked(pol.arn); att == 0 {
				continue
			}
		}
		items = append(items, pol)
	}
	key := func(pol *policy) string { return strings.ToLower(pol.name) + "\x00" + pol.arn }
	slices.SortFunc(items, func(a, b *policy) int { return strings.Compare(key(a), key(b)) })
	pageItems, pg, err := paginate(p, items, key)
	if err != nil {
		return nil, err
	}
	out := listPoliciesResult{page: pg, Policies: []xmlPolicy{}}
	for _, pol := range pageItems {
		out.Policies = append(out.Policies, s.policyView(pol, false))
	}
	return out, nil
}

type policyVersionResult struct {
	PolicyVersion xmlPolicyVersion `xml:"PolicyVersion"`
}

func (s *Server) getPolicyVersion(p params) (any, *apiError) {
	pol, err := s.lookupPolicyLocked(p)
	if err != nil {
		return nil, err
	}
	id, err := p.required("VersionId")
	if err != nil {
		return nil, err
	}
	v := pol.version(id)
	if v == nil {
		return nil, noSuchEntity("Policy %s version %s does not exist or is not attachable.", pol.arn, id)
	}
	return policyVersionResult{PolicyVersion: versionView(pol, v, true)}, nil
}

type listPolicyVersionsResult struct {
	Versions []xmlPolicyVersion `xml:"Versions>member"`
	page
}

func (s *Server) listPolicyVersions(p params) (any, *apiError) {
	pol, err := s.lookupPolicyLocked(p)
	if err != nil {
		return nil, err
	}
	// Newest first, as IAM lists them; the key sorts descending version numbers.
	items := slices.Clone(pol.versions)
	slices.Reverse(items)
	key := func(v *policyVersion) string {
		n, _ := strconv.Atoi(strings.TrimPrefix(v.id, "v"))
		return strconv.Itoa(1_000_000_000 - n)
	}
	pageItems, pg, err := paginate(p, items, key)
	if err != nil {
		return nil, err
	}
	out := listPolicyVersionsResult{page: pg}
	for _, v := range pageItems {
		out.Versions = append(out.Versions, versionView(pol, v, false))
	}
	return out, nil
}

func (s *Server) createPolicyVersion(p params) (any, *apiError) {
	pol, err := s.lookupMutablePolicyLocked(p, "CreatePolicyVersion")
	if err != nil {
		return nil, err
	}
	doc, err := p.required("PolicyDocument")
	if err != nil {
		return nil, err
	}
	if err := validateDocument(doc, identityPolicy, "PolicySize", policySizeQuota); err != nil {
		return nil, err
	}
	if len(pol.versions) >= maxPolicyVersions {
		return nil, limitExceeded("A managed policy can have up to %d versions. Before you create a new version, you must delete an existing version.", maxPolicyVersions)
	}
	now := s.timestamp()
	v := &policyVersion{id: "v" + strconv.Itoa(pol.nextVersion), document: doc, created: now}
	pol.nextVersion++
	pol.versions = append(pol.versions, v)
	if p.boolean("SetAsDefault") {
		pol.defaultVersion = v.id
		pol.updated = now
	}
	return policyVersionResult{PolicyVersion: versionView(pol, v, false)}, nil
}

func (s *Server) deletePolicyVersion(p params) (any, *apiError) {
	pol, err := s.lookupMutablePolicyLocked(p, "DeletePolicyVersion")
	if err != nil {
		return nil, err
	}
	id, err := p.required("VersionId")
	if err != nil {
		return nil, err
	}
	if pol.version(id) == nil {
		return nil, noSuchEntity("Policy %s version %s does not exist or is not attachable.", pol.arn, id)
	}
	if id == pol.defaultVersion {
		return nil, deleteConflict("Cannot delete the default version of a policy.")
	}
	pol.versions = slices.DeleteFunc(pol.versions, func(v *policyVersion) bool { return v.id == id })
	return nil, nil
}

func (s *Server) setDefaultPolicyVersion(p params) (any, *apiError) {
	pol, err := s.lookupMutablePolicyLocked(p, "SetDefaultPolicyVersion")
	if err != nil {
		return nil, err
	}
	id, err := p.required("VersionId")
	if err != nil {
		return nil, err
	}
	if pol.version(id) == nil {
		return nil, noSuchEntity("Policy %s version %s does not exist or is not attachable.", pol.arn, id)
	}
	if pol.defaultVersion != id {
		pol.defaultVersion = id
		pol.updated = s.timestamp()
	}
	return nil, nil
}

func (s *Server) tagPolicy(p params) (any, *apiError) {
	pol, err := s.lookupMutablePolicyLocked(p, "TagPolicy")
	if err != nil {
		return nil, err
	}
	tags, err := p.tags()
	if err != nil {
		return nil, err
	}
	merged, err := mergeTags(pol.tags, tags)
	if err != nil {
		return nil, err
	}
	pol.tags = merged
	return nil, nil
}

func (s *Server) untagPolicy(p params) (any, *apiError) {
	pol, err := s.lookupMutablePolicyLocked(p, "UntagPolicy")
	if err != nil {
		return nil, err
	}
	pol.tags = removeTags(pol.tags, p.tagKeys())
	return nil, nil
}

type listTagsResult struct {
	Tags []Tag `xml:"Tags>member"`
	page
}

func listTags(p params, tags []Tag) (any, *apiError) {
	items := slices.Clone(tags)
	key := func(t Tag) string { return strings.ToLower(t.Key) }
	slices.SortFunc(items, func(a, b Tag) int { return strings.Compare(key(a), key(b)) })
	pageItems, pg, err := paginate(p, items, key)
	if err != nil {
		return nil, err
	}
	return listTagsResult{Tags: pageItems, page: pg}, nil
}

func (s *Server) listPolicyTags(p params) (any, *apiError) {
	pol, err := s.lookupPolicyLocked(p)
	if err != nil {
		return nil, err
	}
	return listTags(p, pol.tags)
}
