package iamemulator_test

import (
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

// TestPolicyGrammar checks the statement rules IAM applies to identity policies and trust
// policies, each answered with MalformedPolicyDocument and IAM's message, changing nothing.
func TestPolicyGrammar(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	stmt := func(s string) string { return `{"Version":"2012-10-17","Statement":[` + s + `]}` }
	for _, tc := range []struct {
		name, doc, msg string
		trust          bool
	}{
		{name: "effect", doc: stmt(`{"Effect":"Maybe","Action":"s3:GetObject","Resource":"*"}`), msg: "Invalid effect: Maybe"},
		{name: "no action", doc: stmt(`{"Effect":"Allow","Resource":"*"}`), msg: "Policy statement must contain actions."},
		{name: "action without a vendor", doc: stmt(`{"Effect":"Allow","Action":"GetObject","Resource":"*"}`), msg: "Actions/Conditions must be prefaced by a vendor"},
		{name: "no resource", doc: stmt(`{"Effect":"Allow","Action":"s3:GetObject"}`), msg: "Policy statement must contain resources."},
		{name: "resource not an ARN", doc: stmt(`{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3"}`), msg: `Resource arn:aws:s3 must be in ARN format or "*".`},
		{name: "principal in an identity policy", doc: stmt(`{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*"}`), msg: "Policy document should not specify a principal."},
		{name: "unknown condition operator", doc: stmt(`{"Effect":"Allow","Action":"s3:GetObject","Resource":"*","Condition":{"StringEqualz":{"aws:SourceIp":"1.2.3.4"}}}`), msg: "Invalid Condition type : StringEqualz"},
		{name: "condition key without a vendor", doc: stmt(`{"Effect":"Allow","Action":"s3:GetObject","Resource":"*","Condition":{"StringEquals":{"SourceIp":"1.2.3.4"}}}`), msg: "Actions/Conditions must be prefaced by a vendor"},
		{name: "trust without a principal", trust: true, doc: stmt(`{"Effect":"Allow","Action":"sts:AssumeRole"}`), msg: "Missing required field Principal"},
		{name: "trust with a resource", trust: true, doc: stmt(`{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole","Resource":"*"}`), msg: "Has prohibited field Resource"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.trust {
				_, err = e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("r"), AssumeRolePolicyDocument: aws.String(tc.doc)})
			} else {
				_, err = e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("p"), PolicyDocument: aws.String(tc.doc)})
			}
			wantErr[*types.MalformedPolicyDocumentException](t, err, "MalformedPolicyDocument")
			if err != nil && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message %q, want %q", err, tc.msg)
			}
		})
	}
	if st := e.emu.State(); len(st.Roles) != 0 || len(st.Policies) != 0 {
		t.Fatalf("rejected requests changed state: %d roles, %d policies", len(st.Roles), len(st.Policies))
	}
	// What IAM accepts: set operators, IfExists, Null, NotAction/NotResource, an OIDC key.
	ok := stmt(`{"Effect":"Deny","NotAction":["iam:*"],"NotResource":"arn:aws:s3:::b/*","Condition":{` +
		`"ForAnyValue:StringLikeIfExists":{"aws:TagKeys":["a*"]},"Null":{"aws:TokenIssueTime":"true"}}}`)
	must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("ok"), PolicyDocument: aws.String(ok)})).ok(t)
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("ok"), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)
}
