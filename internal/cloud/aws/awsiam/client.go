// Package awsiam is the iam controller's thin adapter over the AWS SDK for Go v2 (IAM and
// STS): managed policies and their versions, roles, role attachments, permissions
// boundaries and tags, in plain Go types. It holds no business logic: names, trust policy
// contents and document comparison live with the controller.
//
// Policy documents cross this package as plain JSON: IAM answers them percent-encoded and
// the adapter decodes them. Every error names the operation and the resource (see Error);
// ErrorCode, IsNotFound, IsAlreadyExists, IsConflict and IsThrottleOrServer classify them.
// Throttling, 5xx answers and network errors are retried by the SDK (NewRetryer) before an
// error is returned.
package awsiam

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// DefaultMaxSessionDuration is IAM's default MaxSessionDuration of a role, in seconds.
const DefaultMaxSessionDuration = 3600

// Client calls IAM and STS. It is safe for concurrent use.
type Client struct {
	iam *iam.Client
	sts *sts.Client
}

// New returns a client over cfg (usually from LoadConfig). The IAM and STS clients resolve
// their endpoints from cfg, including cfg.BaseEndpoint and the service-specific endpoint
// settings (AWS_ENDPOINT_URL_IAM, AWS_ENDPOINT_URL_STS) that LoadConfig gathered.
func New(cfg aws.Config) *Client {
	return &Client{
		iam: iam.NewFromConfig(cfg, func(o *iam.Options) { o.APIOptions = append(o.APIOptions, Metered("iam")) }),
		sts: sts.NewFromConfig(cfg, func(o *sts.Options) { o.APIOptions = append(o.APIOptions, Metered("sts")) }),
	}
}

// Tags are IAM tags, key to value.
type Tags map[string]string

// Policy is a customer-managed (or AWS-managed) IAM policy.
type Policy struct {
	ARN, ID, Name, Path, Description, DefaultVersionID string
	// AttachmentCount is how many users, groups and roles the policy is attached to.
	AttachmentCount int32
	Tags            Tags
}

// PolicyVersion is a version of a managed policy, without its document.
type PolicyVersion struct {
	ID        string
	IsDefault bool
	Created   time.Time
}

// Role is an IAM role.
type Role struct {
	Name, ID, ARN, Path, Description string
	// TrustPolicy is the assume-role policy document as plain JSON (IAM returns it
	// percent-encoded).
	TrustPolicy        string
	MaxSessionDuration int32
	// PermissionsBoundaryARN is the ARN of the role's permissions boundary policy, "" if none.
	PermissionsBoundaryARN string
	Tags                   Tags
	// Created is the role's creation time.
	Created time.Time
}

// NewPolicy is a policy to create.
type NewPolicy struct {
	Name        string
	Path        string // "" is IAM's default "/"
	Description string // optional; IAM cannot change it later
	Document    string // JSON
	Tags        Tags
}

// NewRole is a role to create.
type NewRole struct {
	Name        string
	Path        string // "" is IAM's default "/"
	Description string
	TrustPolicy string // JSON
	// MaxSessionDuration in seconds (3600–43200); 0 leaves IAM's default (3600).
	MaxSessionDuration int32
	// PermissionsBoundaryARN is the boundary policy's ARN; "" for none.
	PermissionsBoundaryARN string
	Tags                   Tags
}

// AccountID returns the AWS account of the caller's credentials (STS GetCallerIdentity).
func (c *Client) AccountID(ctx context.Context) (string, error) {
	out, err := c.sts.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		return "", wrap("sts", "GetCallerIdentity", err)
	}
	return aws.ToString(out.Account), nil
}

// GetPolicy returns the policy with the given ARN, with its description and tags.
func (c *Client) GetPolicy(ctx context.Context, arn string) (*Policy, error) {
	out, err := c.iam.GetPolicy(ctx, &iam.GetPolicyInput{PolicyArn: aws.String(arn)})
	if err != nil {
		return nil, iamErr("GetPolicy", err, arn)
	}
	return policyFrom(out.Policy), nil
}

// GetPolicyDocument returns the document of a version of a policy as plain JSON.
func (c *Client) GetPolicyDocument(ctx context.Context, arn, versionID string) (string, error) {
	out, err := c.iam.GetPolicyVersion(ctx, &iam.GetPolicyVersionInput{PolicyArn: aws.String(arn), VersionId: aws.String(versionID)})
	if err != nil {
		return "", iamErr("GetPolicyVersion", err, arn, versionID)
	}
	if out.PolicyVersion == nil {
		return "", nil
	}
	doc, err := decodeDocument(aws.ToString(out.PolicyVersion.Document))
	if err != nil {
		return "", iamErr("GetPolicyVersion", err, arn, versionID)
	}
	return doc, nil
}

// CreatePolicy creates a managed policy whose first version (v1, the default) is p.Document.
func (c *Client) CreatePolicy(ctx context.Context, p NewPolicy) (*Policy, error) {
	out, err := c.iam.CreatePolicy(ctx, &iam.CreatePolicyInput{
		PolicyName:     aws.String(p.Name),
		PolicyDocument: aws.String(p.Document),
		Path:           optional(p.Path),
		Description:    optional(p.Description),
		Tags:           sdkTags(p.Tags),
	})
	if err != nil {
		return nil, iamErr("CreatePolicy", err, p.Name)
	}
	return policyFrom(out.Policy), nil
}

// ListPolicyVersions returns every version of a policy (all pages), oldest first.
func (c *Client) ListPolicyVersions(ctx context.Context, arn string) ([]PolicyVersion, error) {
	var out []PolicyVersion
	pager := iam.NewListPolicyVersionsPaginator(c.iam, &iam.ListPolicyVersionsInput{PolicyArn: aws.String(arn)})
	for pager.HasMorePages() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, iamErr("ListPolicyVersions", err, arn)
		}
		for _, v := range page.Versions {
			out = append(out, PolicyVersion{ID: aws.ToString(v.VersionId), IsDefault: v.IsDefaultVersion, Created: aws.ToTime(v.CreateDate)})
		}
	}
	slices.SortStableFunc(out, func(a, b PolicyVersion) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(versionNumber(a.ID), versionNumber(b.ID)), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// versionNumber is N of a version ID "vN" (IAM numbers versions in creation order, and
// creation times have one-second resolution), or 0.
func versionNumber(id string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(id, "v"))
	return n
}

// CreatePolicyVersion adds a version with document to a policy and makes it the default.
// IAM keeps at most five versions: delete one first when there are five.
func (c *Client) CreatePolicyVersion(ctx context.Context, arn, document string) (versionID string, err error) {
	out, err := c.iam.CreatePolicyVersion(ctx, &iam.CreatePolicyVersionInput{
		PolicyArn: aws.String(arn), PolicyDocument: aws.String(document), SetAsDefault: true,
	})
	if err != nil {
		return "", iamErr("CreatePolicyVersion", err, arn)
	}
	if out.PolicyVersion == nil {
		return "", nil
	}
	return aws.ToString(out.PolicyVersion.VersionId), nil
}

// DeletePolicyVersion deletes a non-default version of a policy.
func (c *Client) DeletePolicyVersion(ctx context.Context, arn, versionID string) error {
	_, err := c.iam.DeletePolicyVersion(ctx, &iam.DeletePolicyVersionInput{PolicyArn: aws.String(arn), VersionId: aws.String(versionID)})
	return iamErr("DeletePolicyVersion", err, arn, versionID)
}

// DeletePolicy deletes a policy. IAM refuses (DeleteConflict) while it is attached or has
// versions other than the default.
func (c *Client) DeletePolicy(ctx context.Context, arn string) error {
	_, err := c.iam.DeletePolicy(ctx, &iam.DeletePolicyInput{PolicyArn: aws.String(arn)})
	return iamErr("DeletePolicy", err, arn)
}

// ListRolesForPolicy returns the names of the roles the policy is attached to as a
// permissions policy (all pages of ListEntitiesForPolicy with EntityFilter Role and
// PolicyUsageFilter PermissionsPolicy): roles that only use it as a permissions boundary are
// not listed, since DetachPolicy cannot remove a boundary.
func (c *Client) ListRolesForPolicy(ctx context.Context, arn string) ([]string, error) {
	var out []string
	pager := iam.NewListEntitiesForPolicyPaginator(c.iam, &iam.ListEntitiesForPolicyInput{
		PolicyArn:         aws.String(arn),
		EntityFilter:      types.EntityTypeRole,
		PolicyUsageFilter: types.PolicyUsageTypePermissionsPolicy,
	})
	for pager.HasMorePages() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, iamErr("ListEntitiesForPolicy", err, arn)
		}
		for _, r := range page.PolicyRoles {
			out = append(out, aws.ToString(r.RoleName))
		}
	}
	return out, nil
}

// GetRole returns a role with its trust policy (decoded), permissions boundary and tags.
func (c *Client) GetRole(ctx context.Context, name string) (*Role, error) {
	out, err := c.iam.GetRole(ctx, &iam.GetRoleInput{RoleName: aws.String(name)})
	if err != nil {
		return nil, iamErr("GetRole", err, name)
	}
	r, err := roleFrom(out.Role)
	if err != nil {
		return nil, iamErr("GetRole", err, name)
	}
	return r, nil
}

// CreateRole creates a role.
func (c *Client) CreateRole(ctx context.Context, r NewRole) (*Role, error) {
	in := &iam.CreateRoleInput{
		RoleName:                 aws.String(r.Name),
		AssumeRolePolicyDocument: aws.String(r.TrustPolicy),
		Path:                     optional(r.Path),
		Description:              optional(r.Description),
		PermissionsBoundary:      optional(r.PermissionsBoundaryARN),
		Tags:                     sdkTags(r.Tags),
	}
	if r.MaxSessionDuration != 0 {
		in.MaxSessionDuration = aws.Int32(r.MaxSessionDuration)
	}
	out, err := c.iam.CreateRole(ctx, in)
	if err != nil {
		return nil, iamErr("CreateRole", err, r.Name)
	}
	role, err := roleFrom(out.Role)
	if err != nil {
		return nil, iamErr("CreateRole", err, r.Name)
	}
	return role, nil
}

// UpdateTrustPolicy replaces a role's trust (assume-role) policy with document.
func (c *Client) UpdateTrustPolicy(ctx context.Context, role, document string) error {
	_, err := c.iam.UpdateAssumeRolePolicy(ctx, &iam.UpdateAssumeRolePolicyInput{RoleName: aws.String(role), PolicyDocument: aws.String(document)})
	return iamErr("UpdateAssumeRolePolicy", err, role)
}

// UpdateRole sets a role's description ("" clears it) and maximum session duration in
// seconds (0 means IAM's default, DefaultMaxSessionDuration, as for NewRole).
func (c *Client) UpdateRole(ctx context.Context, role, description string, maxSessionDuration int32) error {
	if maxSessionDuration == 0 {
		maxSessionDuration = DefaultMaxSessionDuration
	}
	_, err := c.iam.UpdateRole(ctx, &iam.UpdateRoleInput{
		RoleName: aws.String(role), Description: aws.String(description), MaxSessionDuration: aws.Int32(maxSessionDuration),
	})
	return iamErr("UpdateRole", err, role)
}

// PutPermissionsBoundary sets (or replaces) a role's permissions boundary to the policy arn.
func (c *Client) PutPermissionsBoundary(ctx context.Context, role, arn string) error {
	_, err := c.iam.PutRolePermissionsBoundary(ctx, &iam.PutRolePermissionsBoundaryInput{RoleName: aws.String(role), PermissionsBoundary: aws.String(arn)})
	return iamErr("PutRolePermissionsBoundary", err, role, arn)
}

// DeletePermissionsBoundary removes a role's permissions boundary.
func (c *Client) DeletePermissionsBoundary(ctx context.Context, role string) error {
	_, err := c.iam.DeleteRolePermissionsBoundary(ctx, &iam.DeleteRolePermissionsBoundaryInput{RoleName: aws.String(role)})
	return iamErr("DeleteRolePermissionsBoundary", err, role)
}

// ListAttachedPolicies returns the ARNs of the managed policies attached to a role (all pages).
func (c *Client) ListAttachedPolicies(ctx context.Context, role string) ([]string, error) {
	var out []string
	pager := iam.NewListAttachedRolePoliciesPaginator(c.iam, &iam.ListAttachedRolePoliciesInput{RoleName: aws.String(role)})
	for pager.HasMorePages() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, iamErr("ListAttachedRolePolicies", err, role)
		}
		for _, p := range page.AttachedPolicies {
			out = append(out, aws.ToString(p.PolicyArn))
		}
	}
	return out, nil
}

// AttachPolicy attaches the managed policy arn to a role (a no-op when it is attached).
func (c *Client) AttachPolicy(ctx context.Context, role, arn string) error {
	_, err := c.iam.AttachRolePolicy(ctx, &iam.AttachRolePolicyInput{RoleName: aws.String(role), PolicyArn: aws.String(arn)})
	return iamErr("AttachRolePolicy", err, role, arn)
}

// DetachPolicy detaches the managed policy arn from a role; NoSuchEntity if it is not attached.
func (c *Client) DetachPolicy(ctx context.Context, role, arn string) error {
	_, err := c.iam.DetachRolePolicy(ctx, &iam.DetachRolePolicyInput{RoleName: aws.String(role), PolicyArn: aws.String(arn)})
	return iamErr("DetachRolePolicy", err, role, arn)
}

// ListInlinePolicies returns the names of a role's inline policies (all pages).
func (c *Client) ListInlinePolicies(ctx context.Context, role string) ([]string, error) {
	var out []string
	pager := iam.NewListRolePoliciesPaginator(c.iam, &iam.ListRolePoliciesInput{RoleName: aws.String(role)})
	for pager.HasMorePages() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, iamErr("ListRolePolicies", err, role)
		}
		out = append(out, page.PolicyNames...)
	}
	return out, nil
}

// GetInlinePolicy returns the document of a role's inline policy as plain JSON.
func (c *Client) GetInlinePolicy(ctx context.Context, role, name string) (string, error) {
	out, err := c.iam.GetRolePolicy(ctx, &iam.GetRolePolicyInput{RoleName: aws.String(role), PolicyName: aws.String(name)})
	if err != nil {
		return "", iamErr("GetRolePolicy", err, role, name)
	}
	doc, err := decodeDocument(aws.ToString(out.PolicyDocument))
	if err != nil {
		return "", iamErr("GetRolePolicy", err, role, name)
	}
	return doc, nil
}

// PutInlinePolicy creates or replaces a role's inline policy.
func (c *Client) PutInlinePolicy(ctx context.Context, role, name, document string) error {
	_, err := c.iam.PutRolePolicy(ctx, &iam.PutRolePolicyInput{RoleName: aws.String(role), PolicyName: aws.String(name), PolicyDocument: aws.String(document)})
	return iamErr("PutRolePolicy", err, role, name)
}

// DeleteInlinePolicy deletes a role's inline policy; NoSuchEntity when it has none of the name.
func (c *Client) DeleteInlinePolicy(ctx context.Context, role, name string) error {
	_, err := c.iam.DeleteRolePolicy(ctx, &iam.DeleteRolePolicyInput{RoleName: aws.String(role), PolicyName: aws.String(name)})
	return iamErr("DeleteRolePolicy", err, role, name)
}

// DeleteRole deletes a role. IAM refuses (DeleteConflict) while managed or inline policies
// are attached or the role is in an instance profile; a permissions boundary does not block.
func (c *Client) DeleteRole(ctx context.Context, role string) error {
	_, err := c.iam.DeleteRole(ctx, &iam.DeleteRoleInput{RoleName: aws.String(role)})
	return iamErr("DeleteRole", err, role)
}

// TagRole adds tags to a role, overwriting the values of keys it already has; other tags are
// kept. Empty tags make no call.
func (c *Client) TagRole(ctx context.Context, role string, tags Tags) error {
	if len(tags) == 0 {
		return nil
	}
	_, err := c.iam.TagRole(ctx, &iam.TagRoleInput{RoleName: aws.String(role), Tags: sdkTags(tags)})
	return iamErr("TagRole", err, role)
}

// UntagRole removes the tags with these keys from a role; keys it does not have are fine. No keys
// make no call.
func (c *Client) UntagRole(ctx context.Context, role string, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := c.iam.UntagRole(ctx, &iam.UntagRoleInput{RoleName: aws.String(role), TagKeys: keys})
	return iamErr("UntagRole", err, role)
}

// TagPolicy adds tags to a policy, overwriting the values of keys it already has; other tags
// are kept. Empty tags make no call.
func (c *Client) TagPolicy(ctx context.Context, arn string, tags Tags) error {
	if len(tags) == 0 {
		return nil
	}
	_, err := c.iam.TagPolicy(ctx, &iam.TagPolicyInput{PolicyArn: aws.String(arn), Tags: sdkTags(tags)})
	return iamErr("TagPolicy", err, arn)
}

func policyFrom(p *types.Policy) *Policy {
	if p == nil {
		return &Policy{}
	}
	return &Policy{
		ARN:              aws.ToString(p.Arn),
		ID:               aws.ToString(p.PolicyId),
		Name:             aws.ToString(p.PolicyName),
		Path:             aws.ToString(p.Path),
		Description:      aws.ToString(p.Description),
		DefaultVersionID: aws.ToString(p.DefaultVersionId),
		AttachmentCount:  aws.ToInt32(p.AttachmentCount),
		Tags:             tagsFrom(p.Tags),
	}
}

func roleFrom(r *types.Role) (*Role, error) {
	if r == nil {
		return &Role{}, nil
	}
	trust, err := decodeDocument(aws.ToString(r.AssumeRolePolicyDocument))
	if err != nil {
		return nil, err
	}
	out := &Role{
		Name:               aws.ToString(r.RoleName),
		ID:                 aws.ToString(r.RoleId),
		ARN:                aws.ToString(r.Arn),
		Path:               aws.ToString(r.Path),
		Created:            aws.ToTime(r.CreateDate),
		Description:        aws.ToString(r.Description),
		TrustPolicy:        trust,
		MaxSessionDuration: aws.ToInt32(r.MaxSessionDuration),
		Tags:               tagsFrom(r.Tags),
	}
	if r.PermissionsBoundary != nil {
		out.PermissionsBoundaryARN = aws.ToString(r.PermissionsBoundary.PermissionsBoundaryArn)
	}
	return out, nil
}

// decodeDocument decodes a policy document as IAM returns it (percent-encoded, RFC 3986). A "+"
// is a plus, not a space (that would be form encoding), so PathUnescape, not QueryUnescape.
func decodeDocument(s string) (string, error) {
	doc, err := url.PathUnescape(s)
	if err != nil {
		return "", fmt.Errorf("decoding policy document: %w", err)
	}
	return doc, nil
}

// tagsFrom converts SDK tags; nil for none.
func tagsFrom(tags []types.Tag) Tags {
	if len(tags) == 0 {
		return nil
	}
	out := make(Tags, len(tags))
	for _, t := range tags {
		out[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return out
}

// sdkTags converts tags to the SDK's type, sorted by key; nil for none.
func sdkTags(tags Tags) []types.Tag {
	if len(tags) == 0 {
		return nil
	}
	out := make([]types.Tag, 0, len(tags))
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		out = append(out, types.Tag{Key: aws.String(k), Value: aws.String(tags[k])})
	}
	return out
}

// optional returns nil for "" so that IAM applies its default.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return aws.String(s)
}

// ServiceAccess is when a role last used a service its policies grant (LastUsed nil: not within
// IAM's tracking period), and, for services IAM tracks by action, each action.
type ServiceAccess struct {
	Namespace, Name string
	LastUsed        *time.Time
	Actions         []ActionAccess // nil for services not tracked by action
}

// ActionAccess is when a role last used one action.
type ActionAccess struct {
	Name     string // without the service prefix, as IAM reports it
	LastUsed *time.Time
}

// AccessReport is a last-accessed job's state: Status IN_PROGRESS, COMPLETED (Services) or FAILED
// (Error, IAM's message).
type AccessReport struct {
	Status   string
	Error    string
	Services []ServiceAccess
}

// StartAccessReport asks IAM for the role's (or policy's) last-accessed information by action:
// an asynchronous job whose ID AccessReport polls.
func (c *Client) StartAccessReport(ctx context.Context, arn string) (string, error) {
	out, err := c.iam.GenerateServiceLastAccessedDetails(ctx, &iam.GenerateServiceLastAccessedDetailsInput{
		Arn: aws.String(arn), Granularity: types.AccessAdvisorUsageGranularityTypeActionLevel,
	})
	if err != nil {
		return "", iamErr("GenerateServiceLastAccessedDetails", err, arn)
	}
	return aws.ToString(out.JobId), nil
}

// AccessReport reads a last-accessed job: its state and, once completed, every page of its services.
func (c *Client) AccessReport(ctx context.Context, jobID string) (*AccessReport, error) {
	report := &AccessReport{}
	var marker *string
	for {
		out, err := c.iam.GetServiceLastAccessedDetails(ctx, &iam.GetServiceLastAccessedDetailsInput{JobId: aws.String(jobID), Marker: marker})
		if err != nil {
			return nil, iamErr("GetServiceLastAccessedDetails", err, jobID)
		}
		report.Status = string(out.JobStatus)
		if out.Error != nil {
			report.Error = aws.ToString(out.Error.Message)
		}
		for _, s := range out.ServicesLastAccessed {
			sa := ServiceAccess{Namespace: aws.ToString(s.ServiceNamespace), Name: aws.ToString(s.ServiceName), LastUsed: s.LastAuthenticated}
			for _, a := range s.TrackedActionsLastAccessed {
				sa.Actions = append(sa.Actions, ActionAccess{Name: aws.ToString(a.ActionName), LastUsed: a.LastAccessedTime})
			}
			report.Services = append(report.Services, sa)
		}
		if out.JobStatus != types.JobStatusTypeCompleted || !out.IsTruncated {
			return report, nil
		}
		marker = out.Marker
	}
}

// GrantingPolicy is one of a role's policies that grants a service: MANAGED (ARN set) or INLINE.
type GrantingPolicy struct {
	Name, Type, ARN string
}

// PoliciesGranting returns, for each service namespace, the role's policies that grant it
// (ListPoliciesGrantingServiceAccess, up to 200 namespaces a call).
func (c *Client) PoliciesGranting(ctx context.Context, arn string, namespaces []string) (map[string][]GrantingPolicy, error) {
	out := map[string][]GrantingPolicy{}
	for chunk := range slices.Chunk(namespaces, 200) {
		var marker *string
		for {
			page, err := c.iam.ListPoliciesGrantingServiceAccess(ctx, &iam.ListPoliciesGrantingServiceAccessInput{
				Arn: aws.String(arn), ServiceNamespaces: chunk, Marker: marker,
			})
			if err != nil {
				return nil, iamErr("ListPoliciesGrantingServiceAccess", err, arn)
			}
			for _, e := range page.PoliciesGrantingServiceAccess {
				ns := aws.ToString(e.ServiceNamespace)
				for _, p := range e.Policies {
					out[ns] = append(out[ns], GrantingPolicy{Name: aws.ToString(p.PolicyName), Type: string(p.PolicyType), ARN: aws.ToString(p.PolicyArn)})
				}
			}
			if !page.IsTruncated {
				break
			}
			marker = page.Marker
		}
	}
	return out, nil
}
