package iamemulator_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

// TestInlineRolePolicies: PutRolePolicy creates and replaces, GetRolePolicy returns the document
// percent-encoded (the SDK leaves it so), ListRolePolicies pages sorted names, DeleteRolePolicy
// removes; IAM's errors: a missing role or policy (NoSuchEntity), a document that is not a policy
// (MalformedPolicyDocument), the role's inline policies together over 10,240 characters without
// whitespace (LimitExceeded, naming the role); a role with inline policies cannot be deleted.
func TestInlineRolePolicies(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("app"), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)
	put := func(name, doc string) error {
		_, err := e.iam.PutRolePolicy(c, &iam.PutRolePolicyInput{RoleName: aws.String("app"), PolicyName: aws.String(name), PolicyDocument: aws.String(doc)})
		return err
	}
	for _, n := range []string{"zeta", "alpha", "mid"} {
		if err := put(n, policyDoc); err != nil {
			t.Fatal(err)
		}
	}
	other := `{"Version":"2012-10-17","Statement":{"Effect":"Allow","Action":"s3:ListBucket","Resource":"*"}}`
	if err := put("mid", other); err != nil {
		t.Fatal(err)
	}
	got := must(e.iam.GetRolePolicy(c, &iam.GetRolePolicyInput{RoleName: aws.String("app"), PolicyName: aws.String("mid")})).ok(t)
	if doc := aws.ToString(got.PolicyDocument); !strings.Contains(doc, "s3%3AListBucket") || aws.ToString(got.RoleName) != "app" {
		t.Errorf("GetRolePolicy: %s", doc)
	}
	var names []string
	p := iam.NewListRolePoliciesPaginator(e.iam, &iam.ListRolePoliciesInput{RoleName: aws.String("app"), MaxItems: aws.Int32(2)})
	for p.HasMorePages() {
		page := must(p.NextPage(c)).ok(t)
		names = append(names, page.PolicyNames...)
	}
	if !slices.Equal(names, []string{"alpha", "mid", "zeta"}) {
		t.Errorf("ListRolePolicies over pages of 2: %v", names)
	}

	_, err := e.iam.GetRolePolicy(c, &iam.GetRolePolicyInput{RoleName: aws.String("app"), PolicyName: aws.String("nope")})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
	_, err = e.iam.PutRolePolicy(c, &iam.PutRolePolicyInput{RoleName: aws.String("nope"), PolicyName: aws.String("x"), PolicyDocument: aws.String(policyDoc)})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
	wantErr[*types.MalformedPolicyDocumentException](t, put("bad", `{"Statement":[]}`), "MalformedPolicyDocument")
	big := `{"Version":"2012-10-17","Statement":{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:::` + strings.Repeat("b", 5000) + `"}}`
	if err := put("big-1", big); err != nil {
		t.Fatal(err)
	}
	err = put("big-2", big)
	wantErr[*types.LimitExceededException](t, err, "LimitExceeded")
	if err != nil && !strings.Contains(err.Error(), "Maximum policy size of 10240 bytes exceeded for role app") {
		t.Errorf("LimitExceeded message: %v", err)
	}

	_, err = e.iam.DeleteRole(c, &iam.DeleteRoleInput{RoleName: aws.String("app")})
	wantErr[*types.DeleteConflictException](t, err, "DeleteConflict")
	for _, n := range []string{"alpha", "mid", "zeta", "big-1"} {
		must(e.iam.DeleteRolePolicy(c, &iam.DeleteRolePolicyInput{RoleName: aws.String("app"), PolicyName: aws.String(n)})).ok(t)
	}
	_, err = e.iam.DeleteRolePolicy(c, &iam.DeleteRolePolicyInput{RoleName: aws.String("app"), PolicyName: aws.String("alpha")})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
	must(e.iam.DeleteRole(c, &iam.DeleteRoleInput{RoleName: aws.String("app")})).ok(t)
}
