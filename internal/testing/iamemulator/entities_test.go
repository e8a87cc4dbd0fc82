package iamemulator_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/smithy-go"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

// listEntityRoles pages through ListEntitiesForPolicy with the SDK's paginator and returns
// the role names and how many pages it took; it checks that PolicyUsers and PolicyGroups
// stay empty and every role carries its RoleId.
func listEntityRoles(t *testing.T, e *env, in *iam.ListEntitiesForPolicyInput) ([]string, int) {
	t.Helper()
	c := ctx(t)
	var names []string
	pages := 0
	pager := iam.NewListEntitiesForPolicyPaginator(e.iam, in)
	for pager.HasMorePages() {
		out := must(pager.NextPage(c)).ok(t)
		pages++
		if len(out.PolicyUsers) != 0 || len(out.PolicyGroups) != 0 {
			t.Errorf("PolicyUsers=%v PolicyGroups=%v, want none", out.PolicyUsers, out.PolicyGroups)
		}
		for _, r := range out.PolicyRoles {
			if aws.ToString(r.RoleId) == "" {
				t.Errorf("role %s has no RoleId", aws.ToString(r.RoleName))
			}
			names = append(names, aws.ToString(r.RoleName))
		}
	}
	return names, pages
}

func TestListEntitiesForPolicy(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	pol := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("shared"), PolicyDocument: aws.String(policyDoc)})).ok(t).Policy
	other := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("other"), PolicyDocument: aws.String(policyDoc)})).ok(t).Policy

	// 7 roles with the policy attached (one under /team/), one using it as a boundary only,
	// one with another policy.
	var want []string
	for i := range 7 {
		name := fmt.Sprintf("att-%d", i)
		path := "/"
		if i == 3 {
			path = "/team/"
		}
		must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String(name), Path: aws.String(path), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)
		must(e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String(name), PolicyArn: pol.Arn})).ok(t)
		want = append(want, name)
	}
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("bounded"), AssumeRolePolicyDocument: aws.String(trustDoc), PermissionsBoundary: pol.Arn})).ok(t)
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("unrelated"), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)
	must(e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("unrelated"), PolicyArn: other.Arn})).ok(t)

	// Role filter, attachments only, three per page: 7 roles in 3 pages, sorted by name.
	got, pages := listEntityRoles(t, e, &iam.ListEntitiesForPolicyInput{
		PolicyArn: pol.Arn, EntityFilter: types.EntityTypeRole, PolicyUsageFilter: types.PolicyUsageTypePermissionsPolicy, MaxItems: aws.Int32(3),
	})
	if !slices.Equal(got, want) || pages != 3 {
		t.Errorf("attached roles = %v in %d pages, want %v in 3", got, pages, want)
	}
	first := must(e.iam.ListEntitiesForPolicy(c, &iam.ListEntitiesForPolicyInput{PolicyArn: pol.Arn, MaxItems: aws.Int32(3)})).ok(t)
	if !first.IsTruncated || aws.ToString(first.Marker) == "" || len(first.PolicyRoles) != 3 {
		t.Errorf("first page: IsTruncated=%v Marker=%q roles=%d", first.IsTruncated, aws.ToString(first.Marker), len(first.PolicyRoles))
	}

	// Without a usage filter IAM lists boundary users too; PermissionsBoundary lists only them.
	if got, _ := listEntityRoles(t, e, &iam.ListEntitiesForPolicyInput{PolicyArn: pol.Arn}); !slices.Equal(got, append(slices.Clone(want), "bounded")) {
		t.Errorf("all usages = %v", got)
	}
	if got, _ := listEntityRoles(t, e, &iam.ListEntitiesForPolicyInput{PolicyArn: pol.Arn, PolicyUsageFilter: types.PolicyUsageTypePermissionsBoundary}); !slices.Equal(got, []string{"bounded"}) {
		t.Errorf("boundary usages = %v", got)
	}
	if got, _ := listEntityRoles(t, e, &iam.ListEntitiesForPolicyInput{PolicyArn: pol.Arn, PathPrefix: aws.String("/team/")}); !slices.Equal(got, []string{"att-3"}) {
		t.Errorf("PathPrefix /team/ = %v", got)
	}
	for _, f := range []types.EntityType{types.EntityTypeUser, types.EntityTypeGroup, types.EntityTypeLocalManagedPolicy, types.EntityTypeAWSManagedPolicy} {
		if got, _ := listEntityRoles(t, e, &iam.ListEntitiesForPolicyInput{PolicyArn: pol.Arn, EntityFilter: f}); len(got) != 0 {
			t.Errorf("EntityFilter %s listed roles %v", f, got)
		}
	}

	// An AWS-managed policy is listable too; a detached role disappears from the list.
	must(e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("att-0"), PolicyArn: aws.String(readOnlyAccess)})).ok(t)
	if got, _ := listEntityRoles(t, e, &iam.ListEntitiesForPolicyInput{PolicyArn: aws.String(readOnlyAccess), EntityFilter: types.EntityTypeRole}); !slices.Equal(got, []string{"att-0"}) {
		t.Errorf("ReadOnlyAccess roles = %v", got)
	}
	must(e.iam.DetachRolePolicy(c, &iam.DetachRolePolicyInput{RoleName: aws.String("att-0"), PolicyArn: pol.Arn})).ok(t)
	if got, _ := listEntityRoles(t, e, &iam.ListEntitiesForPolicyInput{PolicyArn: pol.Arn, EntityFilter: types.EntityTypeRole, PolicyUsageFilter: types.PolicyUsageTypePermissionsPolicy}); !slices.Equal(got, want[1:]) {
		t.Errorf("after detaching att-0: %v", got)
	}

	_, err := e.iam.ListEntitiesForPolicy(c, &iam.ListEntitiesForPolicyInput{PolicyArn: aws.String("arn:aws:iam::000000000000:policy/missing")})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
	_, err = e.iam.ListEntitiesForPolicy(c, &iam.ListEntitiesForPolicyInput{PolicyArn: pol.Arn, EntityFilter: "Robot"})
	wantErr[*smithy.GenericAPIError](t, err, "ValidationError")
	_, err = e.iam.ListEntitiesForPolicy(c, &iam.ListEntitiesForPolicyInput{PolicyArn: pol.Arn, MaxItems: aws.Int32(0)})
	wantErr[*smithy.GenericAPIError](t, err, "ValidationError")
}
