package iamemulator

import (
	"maps"
	"slices"
	"strings"
)

// State is a snapshot of the emulator for assertions; GET /_emulator/state serves it as JSON.
// Policy documents are plain JSON here (not percent-encoded). AWS-managed seed policies are
// left out of Policies.
type State struct {
	AccountID string        `json:"accountId"`
	Policies  []PolicyState `json:"policies"`
	Roles     []RoleState   `json:"roles"`
	// Associations are the EKS Pod Identity associations, sorted by ARN.
	Associations []AssociationState `json:"podIdentityAssociations"`
	Calls        map[string]int     `json:"calls"`
	Faults       map[string]int     `json:"faults"`
	Total        int                `json:"totalCalls"`
	FailRate     float64            `json:"failRate"`
	FailKinds    []FaultKind        `json:"failKinds"`
}

// PolicyState is a customer-managed policy in a State.
type PolicyState struct {
	Arn              string         `json:"arn"`
	Name             string         `json:"name"`
	ID               string         `json:"id"`
	Path             string         `json:"path"`
	Description      string         `json:"description,omitempty"`
	DefaultVersionID string         `json:"defaultVersionId"`
	Versions         []VersionState `json:"versions"`
	Tags             []Tag          `json:"tags,omitempty"`
	AttachmentCount  int            `json:"attachmentCount"`
}

// VersionState is a policy version in a State.
type VersionState struct {
	ID        string `json:"id"`
	Document  string `json:"document"`
	IsDefault bool   `json:"isDefault"`
	CreatedAt string `json:"createDate"`
}

// RoleState is a role in a State.
type RoleState struct {
	Arn                      string   `json:"arn"`
	Name                     string   `json:"name"`
	ID                       string   `json:"id"`
	Path                     string   `json:"path"`
	Description              string   `json:"description,omitempty"`
	AssumeRolePolicyDocument string   `json:"assumeRolePolicyDocument"`
	MaxSessionDuration       int      `json:"maxSessionDuration"`
	PermissionsBoundary      string   `json:"permissionsBoundary,omitempty"`
	AttachedPolicies         []string `json:"attachedPolicies"`
	// InlinePolicies are the role's inline policies: name → document as put.
	InlinePolicies map[string]string `json:"inlinePolicies,omitempty"`
	Tags           []Tag             `json:"tags,omitempty"`
	CreatedAt      string            `json:"createDate"`
}

// State returns a snapshot of the emulator, sorted by ARN.
func (s *Server) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := State{
		AccountID:    s.accountID,
		Policies:     []PolicyState{},
		Roles:        []RoleState{},
		Associations: s.associationStatesLocked(),
		Calls:        maps.Clone(s.calls),
		Faults:       maps.Clone(s.faults),
		FailRate:     s.failRate,
		FailKinds:    slices.Clone(s.failKinds),
	}
	for _, c := range s.calls {
		st.Total += c
	}
	for _, pol := range s.policies {
		if pol.awsManaged {
			continue
		}
		att, _ := s.usageLocked(pol.arn)
		ps := PolicyState{
			Arn: pol.arn, Name: pol.name, ID: pol.id, Path: pol.path, Description: pol.description,
			DefaultVersionID: pol.defaultVersion, Tags: slices.Clone(pol.tags), AttachmentCount: att,
		}
		for _, v := range pol.versions {
			ps.Versions = append(ps.Versions, VersionState{
				ID: v.id, Document: v.document, IsDefault: v.id == pol.defaultVersion, CreatedAt: formatTime(v.created),
			})
		}
		st.Policies = append(st.Policies, ps)
	}
	for _, r := range s.roles {
		st.Roles = append(st.Roles, RoleState{
			Arn: r.arn, Name: r.name, ID: r.id, Path: r.path, Description: r.description,
			AssumeRolePolicyDocument: r.trust, MaxSessionDuration: r.maxSession, PermissionsBoundary: r.boundary,
			AttachedPolicies: append([]string{}, r.attached...), InlinePolicies: maps.Clone(r.inline), Tags: slices.Clone(r.tags),
			CreatedAt: formatTime(r.created),
		})
	}
	slices.SortFunc(st.Policies, func(a, b PolicyState) int { return strings.Compare(a.Arn, b.Arn) })
	slices.SortFunc(st.Roles, func(a, b RoleState) int { return strings.Compare(a.Arn, b.Arn) })
	return st
}
