package iamemulator

import (
	"maps"
	"slices"
	"unicode"
)

// Inline policies: a role's own policies, embedded in it (PutRolePolicy and friends). IAM limits
// their total size per role (whitespace not counted) to maxRoleInlineSize characters.
const maxRoleInlineSize = 10240

func (s *Server) putRolePolicy(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	name, err := p.required("PolicyName")
	if err != nil {
		return nil, err
	}
	if err := checkName("policyName", name, maxPolicyNameLen); err != nil {
		return nil, err
	}
	doc, err := p.required("PolicyDocument")
	if err != nil {
		return nil, err
	}
	if err := validateDocument(doc, identityPolicy, "RolePolicySize", maxRoleInlineSize); err != nil {
		return nil, err
	}
	total := nonSpace(doc)
	for other, d := range r.inline {
		if other != name {
			total += nonSpace(d)
		}
	}
	if total > maxRoleInlineSize {
		return nil, limitExceeded("Maximum policy size of %d bytes exceeded for role %s", maxRoleInlineSize, r.name)
	}
	if r.inline == nil {
		r.inline = map[string]string{}
	}
	r.inline[name] = doc
	return nil, nil
}

func nonSpace(doc string) int {
	n := 0
	for _, c := range doc {
		if !unicode.IsSpace(c) {
			n++
		}
	}
	return n
}

// inlineLocked looks up a role's inline policy named by PolicyName.
func (s *Server) inlineLocked(p params) (*role, string, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, "", err
	}
	name, err := p.required("PolicyName")
	if err != nil {
		return nil, "", err
	}
	if _, ok := r.inline[name]; !ok {
		return nil, "", noSuchEntity("The role policy with name %s cannot be found.", name)
	}
	return r, name, nil
}

type getRolePolicyResult struct {
	RoleName       string `xml:"RoleName"`
	PolicyName     string `xml:"PolicyName"`
	PolicyDocument string `xml:"PolicyDocument"`
}

func (s *Server) getRolePolicy(p params) (any, *apiError) {
	r, name, err := s.inlineLocked(p)
	if err != nil {
		return nil, err
	}
	return getRolePolicyResult{RoleName: r.name, PolicyName: name, PolicyDocument: encodeDocument(r.inline[name])}, nil
}

func (s *Server) deleteRolePolicy(p params) (any, *apiError) {
	r, name, err := s.inlineLocked(p)
	if err != nil {
		return nil, err
	}
	delete(r.inline, name)
	return nil, nil
}

type listRolePoliciesResult struct {
	PolicyNames []string `xml:"PolicyNames>member"`
	page
}

func (s *Server) listRolePolicies(p params) (any, *apiError) {
	r, err := s.lookupRoleLocked(p)
	if err != nil {
		return nil, err
	}
	names := slices.Sorted(maps.Keys(r.inline))
	pageItems, pg, err := paginate(p, names, func(n string) string { return n })
	if err != nil {
		return nil, err
	}
	return listRolePoliciesResult{PolicyNames: pageItems, page: pg}, nil
}
