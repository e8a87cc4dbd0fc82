package iamemulator

import (
	"slices"
	"strings"
	"time"
)

const (
	defaultMaxSessionDuration = 3600
	trustPolicySizeQuota      = 2048
	maxAttachedPerRole        = 10
)

type role struct {
	name        string
	id          string
	arn         string
	path        string
	description string
	trust       string
	maxSession  int
	boundary    string // policy ARN, "" when none
	created     time.Time
	tags        []Tag
	attached    []string          // policy ARNs in attachment order
	inline      map[string]string // inline policies: name → document as put
}

func (s *Server) lookupRoleLocked(p params) (*role, *apiError) {
	name, err := p.required("RoleName")
	if err != nil {
		return nil, err
	}
	r, ok := s.roles[strings.ToLower(name)]
	if !ok {
		return nil, noSuchEntity("The role with name %s cannot be found.", name)
	}
	return r, nil
}

// boundaryLocked validates a PermissionsBoundary policy ARN.
func (s *Server) boundaryLocked(p params) (string, *apiError) {
	arn := p.get("PermissionsBoundary")
	if arn == "" {
		return "", nil
	}
	if _, ok := s.policies[arn]; !ok {
		return "", noSuchEntity("Scope ARN: %s does not exist or is not attachable.", arn)
	}
	return arn, nil
}

type xmlBoundary struct {
	PermissionsBoundaryType string `xml:"PermissionsBoundaryType"`
	PermissionsBoundaryArn  string `xml:"PermissionsBoundaryArn"`
}

type xmlRole struct {
	Path                     string       `xml:"Path"`
	RoleName                 string       `xml:"RoleName"`
	RoleID                   string       `xml:"RoleId"`
	Arn                      string       `xml:"Arn"`
	CreateDate               string       `xml:"CreateDate"`
	AssumeRolePolicyDocument string       `xml:"AssumeRolePolicyDocument,omitempty"`
	Description              string       `xml:"Description,omitempty"`
	MaxSessionDuration       int          `xml:"MaxSessionDuration,omitempty"`
	PermissionsBoundary      *xmlBoundary `xml:"PermissionsBoundary,omitempty"`
	Tags                     []Tag        `xml:"Tags>member,omitempty"`
}

// roleView renders a role; listings (detail=false) omit PermissionsBoundary and Tags like IAM.
func roleView(r *role, detail bool) xmlRole {
	v := xmlRole{
		Path: r.path, RoleName: r.name, RoleID: r.id, Arn: r.arn, CreateDate: formatTime(r.created),
		AssumeRolePolicyDocument: encodeDocument(r.trust), Description: r.description,
		MaxSessionDuration: r.maxSession,
	}
	if detail {
		if r.boundary != "" {
			v.PermissionsBoundary = &xmlBoundary{PermissionsBoundaryType: "PermissionsBoundaryPolicy", PermissionsBoundaryArn: r.boundary}
		}
		v.Tags = slices.Clone(r.tags)
	}
	return v
}

type roleResult struct {
	Role xmlRole `xml:"Role"`
}

func (s *Server) createRole(p params) (any, *apiError) {
	in, err := p.newEntity("RoleName", maxRoleNameLen, "AssumeRolePolicyDocument", trustPolicy, "ACLSizePerRole", trustPolicySizeQuota)
	if err != nil {
		return nil, err
	}
	name, path, trust, desc := in.name, in.path, in.document, in.description
	maxSession, err := p.maxSessionDuration(defaultMaxSessionDuration)
	if err != nil {
		return nil, err
	}
	boundary, err := s.boundaryLocked(p)
	if err != nil {
		return nil, err
	}
	tags, err := p.tags()
	if err != nil {
		return nil, err
	}
	if _, ok := s.roles[strings.ToLower(name)]; ok {
		return nil, alreadyExists("Role with name %s already exists.", name)
	}
	r := &role{
		name: name, id: s.newIDLocked("AROA"), arn: "arn:aws:iam::" + s.accountID + ":role" + path + name,
		path: path, description: desc, trust: trust, maxSession: maxSession, boundary: boundary,
		created: s.timestamp(), tags: tags,
	}
	s.roles[strings.ToLower(name)] = r
	return roleResult{Role: roleView(r, true)}, nil
}

func (s *Server) getRole(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	return roleResult{Role: roleView(r, true)}, nil
}

func (s *Server) updateRole(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	maxSession, err := p.maxSessionDuration(r.maxSession)
	if err != nil {
		return nil, err
	}
	desc, err := p.description()
	if err != nil {
		return nil, err
	}
	if p.has("Description") {
		r.description = desc
	}
	r.maxSession = maxSession
	return struct{}{}, nil
}

func (s *Server) updateAssumeRolePolicy(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	doc, err := p.required("PolicyDocument")
	if err != nil {
		return nil, err
	}
	if err := validateDocument(doc, trustPolicy, "ACLSizePerRole", trustPolicySizeQuota); err != nil {
		return nil, err
	}
	r.trust = doc
	return nil, nil
}

func (s *Server) putRolePermissionsBoundary(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	if _, err := p.required("PermissionsBoundary"); err != nil {
		return nil, err
	}
	boundary, err := s.boundaryLocked(p)
	if err != nil {
		return nil, err
	}
	r.boundary = boundary
	return nil, nil
}

func (s *Server) deleteRolePermissionsBoundary(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	r.boundary = ""
	return nil, nil
}

func (s *Server) deleteRole(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	if len(r.attached) > 0 {
		return nil, deleteConflict("Cannot delete entity, must detach all policies first.")
	}
	if len(r.inline) > 0 {
		return nil, deleteConflict("Cannot delete entity, must delete policies first.")
	}
	delete(s.roles, strings.ToLower(r.name))
	return nil, nil
}

func (s *Server) attachRolePolicy(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	pol, err := s.lookupPolicyLocked(p)
	if err != nil {
		return nil, err
	}
	if slices.Contains(r.attached, pol.arn) {
		return nil, nil
	}
	if len(r.attached) >= maxAttachedPerRole {
		return nil, limitExceeded("Cannot exceed quota for PoliciesPerRole: %d", maxAttachedPerRole)
	}
	r.attached = append(r.attached, pol.arn)
	return nil, nil
}

func (s *Server) detachRolePolicy(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	arn, err := p.required("PolicyArn")
	if err != nil {
		return nil, err
	}
	if !slices.Contains(r.attached, arn) {
		return nil, noSuchEntity("Policy %s was not found.", arn)
	}
	r.attached = slices.DeleteFunc(r.attached, func(a string) bool { return a == arn })
	return nil, nil
}

type xmlAttachedPolicy struct {
	PolicyName string `xml:"PolicyName"`
	PolicyArn  string `xml:"PolicyArn"`
}

type listAttachedRolePoliciesResult struct {
	AttachedPolicies []xmlAttachedPolicy `xml:"AttachedPolicies>member"`
	page
}

func (s *Server) listAttachedRolePolicies(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	prefix, err := p.path("PathPrefix")
	if err != nil {
		return nil, err
	}
	var items []*policy
	for _, arn := range r.attached {
		if pol, ok := s.policies[arn]; ok && strings.HasPrefix(pol.path, prefix) {
			items = append(items, pol)
		}
	}
	key := func(pol *policy) string { return strings.ToLower(pol.name) + "\x00" + pol.arn }
	slices.SortFunc(items, func(a, b *policy) int { return strings.Compare(key(a), key(b)) })
	pageItems, pg, err := paginate(p, items, key)
	if err != nil {
		return nil, err
	}
	out := listAttachedRolePoliciesResult{page: pg}
	for _, pol := range pageItems {
		out.AttachedPolicies = append(out.AttachedPolicies, xmlAttachedPolicy{PolicyName: pol.name, PolicyArn: pol.arn})
	}
	return out, nil
}

type listRolesResult struct {
	Roles []xmlRole `xml:"Roles>member"`
	page
}

func (s *Server) listRoles(p params) (any, *apiError) {
	prefix, err := p.path("PathPrefix")
	if err != nil {
		return nil, err
	}
	var items []*role
	for _, r := range s.roles {
		if strings.HasPrefix(r.path, prefix) {
			items = append(items, r)
		}
	}
	key := func(r *role) string { return strings.ToLower(r.name) }
	slices.SortFunc(items, func(a, b *role) int { return strings.Compare(key(a), key(b)) })
	pageItems, pg, err := paginate(p, items, key)
	if err != nil {
		return nil, err
	}
	out := listRolesResult{page: pg}
	for _, r := range pageItems {
		out.Roles = append(out.Roles, roleView(r, false))
	}
	return out, nil
}

func (s *Server) tagRole(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	tags, err := p.tags()
	if err != nil {
		return nil, err
	}
	merged, err := mergeTags(r.tags, tags)
	if err != nil {
		return nil, err
	}
	r.tags = merged
	return nil, nil
}

func (s *Server) untagRole(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	r.tags = removeTags(r.tags, p.tagKeys())
	return nil, nil
}

func (s *Server) listRoleTags(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	return listTags(p, r.tags)
}
