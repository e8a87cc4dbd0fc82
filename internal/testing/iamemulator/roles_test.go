package iamemulator_test

import (
	"net/url"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/smithy-go"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

const readOnlyAccess = "arn:aws:iam::aws:policy/ReadOnlyAccess"

func TestRoleLifecycle(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	boundary := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("boundary"), PolicyDocument: aws.String(policyDoc)})).ok(t).Policy
	local := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("local"), PolicyDocument: aws.String(policyDoc)})).ok(t).Policy

	created := must(e.iam.CreateRole(c, &iam.CreateRoleInput{
		RoleName:                 aws.String("irsa-app"),
		Path:                     aws.String("/quartermaster/"),
		AssumeRolePolicyDocument: aws.String(trustDoc),
		Description:              aws.String("app role"),
		MaxSessionDuration:       aws.Int32(7200),
		PermissionsBoundary:      boundary.Arn,
		Tags:                     []types.Tag{{Key: aws.String("managed-by"), Value: aws.String("quartermaster")}},
	})).ok(t).Role
	if aws.ToString(created.Arn) != "arn:aws:iam::000000000000:role/quartermaster/irsa-app" {
		t.Errorf("Arn = %q", aws.ToString(created.Arn))
	}
	if !regexp.MustCompile(`^AROA[A-Z0-9]{17}$`).MatchString(aws.ToString(created.RoleId)) {
		t.Errorf("RoleId = %q, want AROA + 17 characters", aws.ToString(created.RoleId))
	}

	_, err := e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("IRSA-APP"), AssumeRolePolicyDocument: aws.String(trustDoc)})
	wantErr[*types.EntityAlreadyExistsException](t, err, "EntityAlreadyExists")
	_, err = e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("x"), AssumeRolePolicyDocument: aws.String(trustDoc),
		PermissionsBoundary: aws.String("arn:aws:iam::000000000000:policy/missing")})
	// IAM answers NoSuchEntity here, but the SDK's model does not list it for CreateRole, so the
	// client surfaces it as a generic API error with that code.
	wantErr[*smithy.GenericAPIError](t, err, "NoSuchEntity")

	role := must(e.iam.GetRole(c, &iam.GetRoleInput{RoleName: aws.String("irsa-app")})).ok(t).Role
	if aws.ToInt32(role.MaxSessionDuration) != 7200 || aws.ToString(role.Description) != "app role" ||
		aws.ToString(role.Path) != "/quartermaster/" || tagString(role.Tags) != "managed-by=quartermaster" {
		t.Errorf("unexpected GetRole result: %+v", role)
	}
	if role.PermissionsBoundary == nil || aws.ToString(role.PermissionsBoundary.PermissionsBoundaryArn) != aws.ToString(boundary.Arn) ||
		role.PermissionsBoundary.PermissionsBoundaryType != types.PermissionsBoundaryAttachmentTypePolicy {
		t.Errorf("PermissionsBoundary = %+v", role.PermissionsBoundary)
	}
	raw := aws.ToString(role.AssumeRolePolicyDocument)
	if raw == trustDoc {
		t.Fatal("AssumeRolePolicyDocument is not percent-encoded")
	}
	if dec, err := url.QueryUnescape(raw); err != nil || dec != trustDoc {
		t.Fatalf("QueryUnescape(AssumeRolePolicyDocument) = %q, %v", dec, err)
	}
	if n := aws.ToInt32(must(e.iam.GetPolicy(c, &iam.GetPolicyInput{PolicyArn: boundary.Arn})).ok(t).Policy.PermissionsBoundaryUsageCount); n != 1 {
		t.Errorf("PermissionsBoundaryUsageCount = %d, want 1", n)
	}

	// Updates.
	must(e.iam.UpdateRole(c, &iam.UpdateRoleInput{RoleName: aws.String("irsa-app"), MaxSessionDuration: aws.Int32(3600), Description: aws.String("new")})).ok(t)
	_, err = e.iam.UpdateRole(c, &iam.UpdateRoleInput{RoleName: aws.String("irsa-app"), MaxSessionDuration: aws.Int32(60)})
	if err == nil {
		t.Error("MaxSessionDuration 60 should be rejected")
	}
	newTrust := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Federated":"arn:aws:iam::000000000000:oidc-provider/oidc.example"},"Action":"sts:AssumeRoleWithWebIdentity"}]}`
	must(e.iam.UpdateAssumeRolePolicy(c, &iam.UpdateAssumeRolePolicyInput{RoleName: aws.String("irsa-app"), PolicyDocument: aws.String(newTrust)})).ok(t)
	must(e.iam.DeleteRolePermissionsBoundary(c, &iam.DeleteRolePermissionsBoundaryInput{RoleName: aws.String("irsa-app")})).ok(t)
	role = must(e.iam.GetRole(c, &iam.GetRoleInput{RoleName: aws.String("irsa-app")})).ok(t).Role
	dec, _ := url.QueryUnescape(aws.ToString(role.AssumeRolePolicyDocument))
	if aws.ToInt32(role.MaxSessionDuration) != 3600 || aws.ToString(role.Description) != "new" || role.PermissionsBoundary != nil || dec != newTrust {
		t.Errorf("role after updates: %+v (trust %q)", role, dec)
	}
	must(e.iam.PutRolePermissionsBoundary(c, &iam.PutRolePermissionsBoundaryInput{RoleName: aws.String("irsa-app"), PermissionsBoundary: boundary.Arn})).ok(t)
	if st := e.emu.State(); st.Roles[0].PermissionsBoundary != aws.ToString(boundary.Arn) {
		t.Errorf("boundary in state = %q", st.Roles[0].PermissionsBoundary)
	}

	// Attachments: AWS-managed and local policies; missing policies and roles are NoSuchEntity.
	must(e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("irsa-app"), PolicyArn: aws.String(readOnlyAccess)})).ok(t)
	must(e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("irsa-app"), PolicyArn: local.Arn})).ok(t)
	must(e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("irsa-app"), PolicyArn: local.Arn})).ok(t) // idempotent
	_, err = e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("irsa-app"), PolicyArn: aws.String("arn:aws:iam::000000000000:policy/missing")})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
	_, err = e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("missing"), PolicyArn: local.Arn})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")

	attached := must(e.iam.ListAttachedRolePolicies(c, &iam.ListAttachedRolePoliciesInput{RoleName: aws.String("irsa-app")})).ok(t).AttachedPolicies
	if len(attached) != 2 || aws.ToString(attached[0].PolicyName) != "local" || aws.ToString(attached[1].PolicyArn) != readOnlyAccess {
		t.Errorf("attached = %+v", attached)
	}
	if n := aws.ToInt32(must(e.iam.GetPolicy(c, &iam.GetPolicyInput{PolicyArn: local.Arn})).ok(t).Policy.AttachmentCount); n != 1 {
		t.Errorf("AttachmentCount = %d, want 1", n)
	}

	_, err = e.iam.DeleteRole(c, &iam.DeleteRoleInput{RoleName: aws.String("irsa-app")})
	wantErr[*types.DeleteConflictException](t, err, "DeleteConflict")
	_, err = e.iam.DeletePolicy(c, &iam.DeletePolicyInput{PolicyArn: local.Arn})
	wantErr[*types.DeleteConflictException](t, err, "DeleteConflict")

	must(e.iam.DetachRolePolicy(c, &iam.DetachRolePolicyInput{RoleName: aws.String("irsa-app"), PolicyArn: local.Arn})).ok(t)
	_, err = e.iam.DetachRolePolicy(c, &iam.DetachRolePolicyInput{RoleName: aws.String("irsa-app"), PolicyArn: local.Arn})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
	must(e.iam.DetachRolePolicy(c, &iam.DetachRolePolicyInput{RoleName: aws.String("irsa-app"), PolicyArn: aws.String(readOnlyAccess)})).ok(t)
	must(e.iam.DeletePolicy(c, &iam.DeletePolicyInput{PolicyArn: local.Arn})).ok(t)
	must(e.iam.DeleteRole(c, &iam.DeleteRoleInput{RoleName: aws.String("irsa-app")})).ok(t)

	for _, call := range []func() error{
		func() error {
			_, err := e.iam.GetRole(c, &iam.GetRoleInput{RoleName: aws.String("irsa-app")})
			return err
		},
		func() error {
			_, err := e.iam.DeleteRole(c, &iam.DeleteRoleInput{RoleName: aws.String("irsa-app")})
			return err
		},
		func() error {
			_, err := e.iam.UpdateRole(c, &iam.UpdateRoleInput{RoleName: aws.String("irsa-app")})
			return err
		},
		func() error {
			_, err := e.iam.ListRoleTags(c, &iam.ListRoleTagsInput{RoleName: aws.String("irsa-app")})
			return err
		},
		func() error {
			_, err := e.iam.ListAttachedRolePolicies(c, &iam.ListAttachedRolePoliciesInput{RoleName: aws.String("irsa-app")})
			return err
		},
	} {
		wantErr[*types.NoSuchEntityException](t, call(), "NoSuchEntity")
	}
	if st := e.emu.State(); len(st.Roles) != 0 || len(st.Policies) != 1 {
		t.Errorf("state after cleanup: %d roles, %d policies; want 0 and 1", len(st.Roles), len(st.Policies))
	}
}

func TestRoleAttachmentQuota(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("r"), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)
	for i := range 11 {
		arn := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("p" + strconv.Itoa(i)), PolicyDocument: aws.String(policyDoc)})).ok(t).Policy.Arn
		_, err := e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("r"), PolicyArn: arn})
		if i < 10 && err != nil {
			t.Fatalf("attach #%d: %v", i, err)
		}
		if i == 10 {
			wantErr[*types.LimitExceededException](t, err, "LimitExceeded")
		}
	}
	// Pagination over attachments with a small page size.
	pager := iam.NewListAttachedRolePoliciesPaginator(e.iam, &iam.ListAttachedRolePoliciesInput{RoleName: aws.String("r"), MaxItems: aws.Int32(3)})
	var names []string
	pages := 0
	for pager.HasMorePages() {
		out := must(pager.NextPage(c)).ok(t)
		pages++
		for _, a := range out.AttachedPolicies {
			names = append(names, aws.ToString(a.PolicyName))
		}
	}
	if pages != 4 || len(names) != 10 {
		t.Errorf("got %d attachments in %d pages, want 10 in 4", len(names), pages)
	}
}

func TestRoleTags(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{
		RoleName: aws.String("tagged"), AssumeRolePolicyDocument: aws.String(trustDoc),
		Tags: []types.Tag{{Key: aws.String("a"), Value: aws.String("1")}, {Key: aws.String("b"), Value: aws.String("2")}},
	})).ok(t)
	must(e.iam.TagRole(c, &iam.TagRoleInput{RoleName: aws.String("tagged"), Tags: []types.Tag{
		{Key: aws.String("b"), Value: aws.String("20")}, {Key: aws.String("c"), Value: aws.String("3")},
	}})).ok(t)
	must(e.iam.UntagRole(c, &iam.UntagRoleInput{RoleName: aws.String("tagged"), TagKeys: []string{"a"}})).ok(t)

	out := must(e.iam.ListRoleTags(c, &iam.ListRoleTagsInput{RoleName: aws.String("tagged"), MaxItems: aws.Int32(1)})).ok(t)
	if !out.IsTruncated || out.Marker == nil || tagString(out.Tags) != "b=20" {
		t.Fatalf("first page = %+v", out)
	}
	out = must(e.iam.ListRoleTags(c, &iam.ListRoleTagsInput{RoleName: aws.String("tagged"), Marker: out.Marker})).ok(t)
	if out.IsTruncated || tagString(out.Tags) != "c=3" {
		t.Fatalf("second page = %+v", out)
	}
	if got := tagString(must(e.iam.GetRole(c, &iam.GetRoleInput{RoleName: aws.String("tagged")})).ok(t).Role.Tags); got != "b=20,c=3" {
		t.Errorf("GetRole tags = %s", got)
	}
	_, err := e.iam.TagRole(c, &iam.TagRoleInput{RoleName: aws.String("missing"), Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
}

// TestGateHoldsRequestsUntilAllArrive: two writers that each read the trust policy and then write
// it, with the writes gated, both read before either writes; the write IAM applies second leaves
// out the other's change (the lost update the shared roles' writers must repair).
func TestGateHoldsRequestsUntilAllArrive(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("shared"), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)
	open := e.emu.Gate("UpdateAssumeRolePolicy", 2)
	t.Cleanup(open)
	docs := map[string]string{}
	for _, svc := range []string{"ec2", "lambda"} {
		docs[svc] = strings.Replace(trustDoc, "ec2.amazonaws.com", svc+".amazonaws.com", 1)
	}
	done := make(chan error, 2)
	write := func(svc string) {
		_, err := e.iam.UpdateAssumeRolePolicy(c, &iam.UpdateAssumeRolePolicyInput{RoleName: aws.String("shared"), PolicyDocument: aws.String(docs[svc])})
		done <- err
	}
	go write("ec2")
	// The first write waits for the second, unanswered and not applied.
	for e.emu.Waiting("UpdateAssumeRolePolicy") != 1 {
		select {
		case err := <-done:
			t.Fatalf("the first gated write was answered alone: %v", err)
		case <-c.Done():
			t.Fatal(c.Err())
		default:
			runtime.Gosched()
		}
	}
	if n := e.emu.Calls("UpdateAssumeRolePolicy"); n != 0 {
		t.Fatalf("a gated write was served before the gate opened (%d calls)", n)
	}
	go write("lambda")
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n := e.emu.Calls("UpdateAssumeRolePolicy"); n != 2 {
		t.Errorf("UpdateAssumeRolePolicy calls = %d, want 2", n)
	}
	// The gate is gone: the next write goes through alone.
	must(e.iam.UpdateAssumeRolePolicy(c, &iam.UpdateAssumeRolePolicyInput{RoleName: aws.String("shared"), PolicyDocument: aws.String(trustDoc)})).ok(t)
}
