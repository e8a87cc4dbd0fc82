package iamemulator_test

import (
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

func TestPaginationWithSDKPaginators(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	const nPolicies, nRoles = 150, 120
	for i := range nPolicies {
		path := "/team-a/"
		if i%3 == 0 {
			path = "/team-b/"
		}
		must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{
			PolicyName: aws.String(fmt.Sprintf("policy-%03d", i)), Path: aws.String(path), PolicyDocument: aws.String(policyDoc),
		})).ok(t)
	}
	for i := range nRoles {
		must(e.iam.CreateRole(c, &iam.CreateRoleInput{
			RoleName: aws.String(fmt.Sprintf("role-%03d", i)), Path: aws.String("/qm/"), AssumeRolePolicyDocument: aws.String(trustDoc),
		})).ok(t)
	}
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("other"), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)

	// Default page size (100): 150 local policies take two ListPolicies calls.
	before := e.emu.Calls("ListPolicies")
	seen := map[string]bool{}
	pager := iam.NewListPoliciesPaginator(e.iam, &iam.ListPoliciesInput{Scope: types.PolicyScopeTypeLocal})
	for pager.HasMorePages() {
		for _, p := range must(pager.NextPage(c)).ok(t).Policies {
			if seen[aws.ToString(p.Arn)] {
				t.Fatalf("policy %s listed twice", aws.ToString(p.Arn))
			}
			seen[aws.ToString(p.Arn)] = true
		}
	}
	if len(seen) != nPolicies {
		t.Errorf("listed %d local policies, want %d", len(seen), nPolicies)
	}
	if calls := e.emu.Calls("ListPolicies") - before; calls != 2 {
		t.Errorf("ListPolicies calls = %d, want 2", calls)
	}

	first := must(e.iam.ListPolicies(c, &iam.ListPoliciesInput{Scope: types.PolicyScopeTypeLocal})).ok(t)
	if len(first.Policies) != 100 || !first.IsTruncated || aws.ToString(first.Marker) == "" {
		t.Errorf("first page: %d policies, IsTruncated=%v, Marker=%q", len(first.Policies), first.IsTruncated, aws.ToString(first.Marker))
	}

	// PathPrefix and a custom page size.
	count := 0
	pager = iam.NewListPoliciesPaginator(e.iam, &iam.ListPoliciesInput{Scope: types.PolicyScopeTypeLocal, PathPrefix: aws.String("/team-b/"), MaxItems: aws.Int32(7)})
	for pager.HasMorePages() {
		for _, p := range must(pager.NextPage(c)).ok(t).Policies {
			if aws.ToString(p.Path) != "/team-b/" {
				t.Errorf("PathPrefix /team-b/ returned %s", aws.ToString(p.Arn))
			}
			count++
		}
	}
	if count != nPolicies/3 {
		t.Errorf("/team-b/ policies = %d, want %d", count, nPolicies/3)
	}

	// Scope=AWS lists only the seeded AWS-managed policies; the default scope lists both.
	aws1 := must(e.iam.ListPolicies(c, &iam.ListPoliciesInput{Scope: types.PolicyScopeTypeAws})).ok(t)
	if len(aws1.Policies) == 0 || aws1.IsTruncated {
		t.Errorf("Scope=AWS: %d policies", len(aws1.Policies))
	}
	for _, p := range aws1.Policies {
		if aws.ToString(p.Arn)[:20] != "arn:aws:iam::aws:pol" {
			t.Errorf("Scope=AWS returned %s", aws.ToString(p.Arn))
		}
	}

	// Roles: 121 in total, 120 under /qm/.
	roles := 0
	pages := 0
	rpager := iam.NewListRolesPaginator(e.iam, &iam.ListRolesInput{PathPrefix: aws.String("/qm/"), MaxItems: aws.Int32(50)})
	for rpager.HasMorePages() {
		out := must(rpager.NextPage(c)).ok(t)
		pages++
		for _, r := range out.Roles {
			if aws.ToString(r.Path) != "/qm/" || r.AssumeRolePolicyDocument == nil {
				t.Errorf("unexpected role in listing: %+v", r)
			}
			roles++
		}
	}
	if roles != nRoles || pages != 3 {
		t.Errorf("listed %d roles in %d pages, want %d in 3", roles, pages, nRoles)
	}
	all := 0
	rpager = iam.NewListRolesPaginator(e.iam, &iam.ListRolesInput{})
	for rpager.HasMorePages() {
		all += len(must(rpager.NextPage(c)).ok(t).Roles)
	}
	if all != nRoles+1 {
		t.Errorf("ListRoles without prefix = %d, want %d", all, nRoles+1)
	}

	// A marker survives a deletion of the item it points at.
	page1 := must(e.iam.ListRoles(c, &iam.ListRolesInput{MaxItems: aws.Int32(10)})).ok(t)
	if last := aws.ToString(page1.Roles[9].RoleName); last != "role-008" { // "other" sorts first
		t.Fatalf("first page ends at %s, want role-008", last)
	}
	must(e.iam.DeleteRole(c, &iam.DeleteRoleInput{RoleName: aws.String("role-009")})).ok(t)
	page2 := must(e.iam.ListRoles(c, &iam.ListRolesInput{MaxItems: aws.Int32(10), Marker: page1.Marker})).ok(t)
	if got := aws.ToString(page2.Roles[0].RoleName); got != "role-010" {
		t.Errorf("page after deleting its first item starts at %s, want role-010", got)
	}

	_, err := e.iam.ListRoles(c, &iam.ListRolesInput{MaxItems: aws.Int32(0)})
	if err == nil {
		t.Error("MaxItems=0 should be rejected")
	}
}

// TestDefaultSDKClient uses the SDK's own HTTP client and default retryer (no HTTPClient
// workaround): large list responses must still come through, retried by the SDK when the
// loopback race of aws/aws-sdk-go-v2#2737 hits.
func TestDefaultSDKClient(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	for i := range 120 {
		must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String(fmt.Sprintf("p-%03d", i)), PolicyDocument: aws.String(policyDoc)})).ok(t)
	}
	cfg := e.cfg.Copy()
	cfg.HTTPClient = nil
	cfg.Retryer = nil
	client := iam.NewFromConfig(cfg)
	for range 5 {
		n := 0
		pager := iam.NewListPoliciesPaginator(client, &iam.ListPoliciesInput{Scope: types.PolicyScopeTypeLocal})
		for pager.HasMorePages() {
			n += len(must(pager.NextPage(c)).ok(t).Policies)
		}
		if n != 120 {
			t.Fatalf("listed %d policies, want 120", n)
		}
	}
}
