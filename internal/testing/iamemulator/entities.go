package iamemulator

import (
	"slices"
	"strings"
)

// The EntityFilter values of ListEntitiesForPolicy.
var entityFilters = []string{"User", "Role", "Group", "LocalManagedPolicy", "AWSManagedPolicy"}

type xmlPolicyRole struct {
	RoleName string `xml:"RoleName"`
	RoleID   string `xml:"RoleId"`
}

type listEntitiesForPolicyResult struct {
	PolicyGroups []struct{}      `xml:"PolicyGroups>member"`
	PolicyUsers  []struct{}      `xml:"PolicyUsers>member"`
	PolicyRoles  []xmlPolicyRole `xml:"PolicyRoles>member"`
	page
}

// listEntitiesForPolicy lists the roles a policy is attached to (PolicyUsageFilter
// PermissionsPolicy) or that use it as a permissions boundary (PermissionsBoundary); both
// without a filter, as IAM does. The emulator has no users or groups, so PolicyUsers and
// PolicyGroups are always empty, and so are all lists for EntityFilter User, Group,
// LocalManagedPolicy and AWSManagedPolicy.
func (s *Server) listEntitiesForPolicy(p params) (any, *apiError) {
	pol, err := s.lookupPolicyLocked(p)
	if err != nil {
		return nil, err
	}
	filter := p.get("EntityFilter")
	if filter != "" && !slices.Contains(entityFilters, filter) {
		return nil, validationError("1 validation error detected: Value '%s' at 'entityFilter' failed to satisfy constraint: Member must satisfy enum value set: [%s]",
			filter, strings.Join(entityFilters, ", "))
	}
	usage := p.get("PolicyUsageFilter")
	if usage != "" && usage != "PermissionsPolicy" && usage != "PermissionsBoundary" {
		return nil, validationError("1 validation error detected: Value '%s' at 'policyUsageFilter' failed to satisfy constraint: Member must satisfy enum value set: [PermissionsPolicy, PermissionsBoundary]", usage)
	}
	prefix, err := p.path("PathPrefix")
	if err != nil {
		return nil, err
	}
	var items []*role
	if filter == "" || filter == "Role" {
		for _, r := range s.roles {
			attached := usage != "PermissionsBoundary" && slices.Contains(r.attached, pol.arn)
			boundary := usage != "PermissionsPolicy" && r.boundary == pol.arn
			if (attached || boundary) && strings.HasPrefix(r.path, prefix) {
				items = append(items, r)
			}
		}
	}
	key := func(r *role) string { return strings.ToLower(r.name) }
	slices.SortFunc(items, func(a, b *role) int { return strings.Compare(key(a), key(b)) })
	pageItems, pg, err := paginate(p, items, key)
	if err != nil {
		return nil, err
	}
	out := listEntitiesForPolicyResult{page: pg, PolicyGroups: []struct{}{}, PolicyUsers: []struct{}{}, PolicyRoles: []xmlPolicyRole{}}
	for _, r := range pageItems {
		out.PolicyRoles = append(out.PolicyRoles, xmlPolicyRole{RoleName: r.name, RoleID: r.id})
	}
	return out, nil
}
