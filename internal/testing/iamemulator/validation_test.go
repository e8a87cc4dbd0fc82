package iamemulator_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/smithy-go"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

func tagsOf(n int) []types.Tag {
	out := make([]types.Tag, n)
	for i := range out {
		out[i] = types.Tag{Key: aws.String("k" + strconv.Itoa(i)), Value: aws.String("v")}
	}
	return out
}

// TestInputValidation checks the constraints IAM enforces on input that a controller can hit
// (names, paths, descriptions, session durations, tags), each with IAM's error code, and that
// a rejected request changes nothing.
func TestInputValidation(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	role := func(mod func(*iam.CreateRoleInput)) error {
		in := &iam.CreateRoleInput{RoleName: aws.String("r"), AssumeRolePolicyDocument: aws.String(trustDoc)}
		mod(in)
		_, err := e.iam.CreateRole(c, in)
		return err
	}
	policy := func(mod func(*iam.CreatePolicyInput)) error {
		in := &iam.CreatePolicyInput{PolicyName: aws.String("p"), PolicyDocument: aws.String(policyDoc)}
		mod(in)
		_, err := e.iam.CreatePolicy(c, in)
		return err
	}
	tag := func(k, v string) []types.Tag { return []types.Tag{{Key: aws.String(k), Value: aws.String(v)}} }

	for _, tc := range []struct {
		name string
		err  error
		code string
	}{
		{"role name 65 chars", role(func(in *iam.CreateRoleInput) { in.RoleName = aws.String(strings.Repeat("r", 65)) }), "ValidationError"},
		{"role name with a space", role(func(in *iam.CreateRoleInput) { in.RoleName = aws.String("my role") }), "ValidationError"},
		{"role name with a slash", role(func(in *iam.CreateRoleInput) { in.RoleName = aws.String("a/b") }), "ValidationError"},
		{"policy name 129 chars", policy(func(in *iam.CreatePolicyInput) { in.PolicyName = aws.String(strings.Repeat("p", 129)) }), "ValidationError"},
		{"policy name with a colon", policy(func(in *iam.CreatePolicyInput) { in.PolicyName = aws.String("a:b") }), "ValidationError"},
		{"path without a trailing slash", role(func(in *iam.CreateRoleInput) { in.Path = aws.String("/qm") }), "ValidationError"},
		{"path without a leading slash", policy(func(in *iam.CreatePolicyInput) { in.Path = aws.String("qm/") }), "ValidationError"},
		{"path with a space", role(func(in *iam.CreateRoleInput) { in.Path = aws.String("/a b/") }), "ValidationError"},
		{"path of 513 chars", policy(func(in *iam.CreatePolicyInput) { in.Path = aws.String("/" + strings.Repeat("a", 511) + "/") }), "ValidationError"},
		{"role description 1001 chars", role(func(in *iam.CreateRoleInput) { in.Description = aws.String(strings.Repeat("d", 1001)) }), "ValidationError"},
		{"policy description 1001 chars", policy(func(in *iam.CreatePolicyInput) { in.Description = aws.String(strings.Repeat("d", 1001)) }), "ValidationError"},
		{"MaxSessionDuration 3599", role(func(in *iam.CreateRoleInput) { in.MaxSessionDuration = aws.Int32(3599) }), "ValidationError"},
		{"MaxSessionDuration 43201", role(func(in *iam.CreateRoleInput) { in.MaxSessionDuration = aws.Int32(43201) }), "ValidationError"},
		{"51 tags", role(func(in *iam.CreateRoleInput) { in.Tags = tagsOf(51) }), "ValidationError"},
		{"tag key 129 chars", policy(func(in *iam.CreatePolicyInput) { in.Tags = tag(strings.Repeat("k", 129), "v") }), "ValidationError"},
		{"tag value 257 chars", role(func(in *iam.CreateRoleInput) { in.Tags = tag("k", strings.Repeat("v", 257)) }), "ValidationError"},
		{"tag key with a comma", role(func(in *iam.CreateRoleInput) { in.Tags = tag("a,b", "v") }), "ValidationError"},
		{"tag key aws:", policy(func(in *iam.CreatePolicyInput) { in.Tags = tag("aws:owner", "v") }), "InvalidInput"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.code == "ValidationError" {
				// IAM's model has no ValidationError shape: the SDK surfaces a generic API error.
				wantErr[*smithy.GenericAPIError](t, tc.err, tc.code)
			} else {
				wantErr[*types.InvalidInputException](t, tc.err, tc.code)
			}
		})
	}
	if st := e.emu.State(); len(st.Roles) != 0 || len(st.Policies) != 0 {
		t.Fatalf("rejected requests changed state: %d roles, %d policies", len(st.Roles), len(st.Policies))
	}

	// The limits themselves are accepted.
	maxName := strings.Repeat("r", 64)
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{
		RoleName: aws.String(maxName), AssumeRolePolicyDocument: aws.String(trustDoc),
		Path: aws.String("/a-b_c.d@e+f=g,h/x/"), Description: aws.String(strings.Repeat("d", 1000)),
		MaxSessionDuration: aws.Int32(43200), Tags: append(tagsOf(49), tag(strings.Repeat("k", 128), strings.Repeat("v", 256))...),
	})).ok(t)
	must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{
		PolicyName: aws.String("A_b+c=d,e.f@g-" + strings.Repeat("p", 114)), PolicyDocument: aws.String(policyDoc),
		Path: aws.String("/" + strings.Repeat("a", 510) + "/"), Tags: tagsOf(50), // a 512-character path
	})).ok(t)

	// UpdateRole validates like CreateRole.
	_, err := e.iam.UpdateRole(c, &iam.UpdateRoleInput{RoleName: aws.String(maxName), MaxSessionDuration: aws.Int32(100)})
	wantErr[*smithy.GenericAPIError](t, err, "ValidationError")
	_, err = e.iam.UpdateRole(c, &iam.UpdateRoleInput{RoleName: aws.String(maxName), Description: aws.String(strings.Repeat("d", 1001))})
	wantErr[*smithy.GenericAPIError](t, err, "ValidationError")
	if r := must(e.iam.GetRole(c, &iam.GetRoleInput{RoleName: aws.String(maxName)})).ok(t).Role; aws.ToInt32(r.MaxSessionDuration) != 43200 || len(r.Tags) != 50 {
		t.Errorf("rejected UpdateRole changed the role: MaxSessionDuration=%d, %d tags", aws.ToInt32(r.MaxSessionDuration), len(r.Tags))
	}

	// Tagging past 50 tags on the resource is LimitExceeded; overwriting an existing key is not.
	_, err = e.iam.TagRole(c, &iam.TagRoleInput{RoleName: aws.String(maxName), Tags: tag("one-more", "v")})
	wantErr[*types.LimitExceededException](t, err, "LimitExceeded")
	must(e.iam.TagRole(c, &iam.TagRoleInput{RoleName: aws.String(maxName), Tags: tag("K0", "new")})).ok(t)
}

// TestDeleteRoleConflicts: attached managed policies block DeleteRole (as inline policies do:
// TestInlineRolePolicies; the emulator has no instance profiles); a permissions boundary does not,
// as in IAM.
func TestDeleteRoleConflicts(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	boundary := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("boundary"), PolicyDocument: aws.String(policyDoc)})).ok(t).Policy
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("bounded"), AssumeRolePolicyDocument: aws.String(trustDoc), PermissionsBoundary: boundary.Arn})).ok(t)
	must(e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("bounded"), PolicyArn: aws.String(readOnlyAccess)})).ok(t)

	_, err := e.iam.DeleteRole(c, &iam.DeleteRoleInput{RoleName: aws.String("bounded")})
	wantErr[*types.DeleteConflictException](t, err, "DeleteConflict")
	must(e.iam.DetachRolePolicy(c, &iam.DetachRolePolicyInput{RoleName: aws.String("bounded"), PolicyArn: aws.String(readOnlyAccess)})).ok(t)
	must(e.iam.DeleteRole(c, &iam.DeleteRoleInput{RoleName: aws.String("bounded")})).ok(t)
	if n := aws.ToInt32(must(e.iam.GetPolicy(c, &iam.GetPolicyInput{PolicyArn: boundary.Arn})).ok(t).Policy.PermissionsBoundaryUsageCount); n != 0 {
		t.Errorf("PermissionsBoundaryUsageCount after DeleteRole = %d, want 0", n)
	}
}
