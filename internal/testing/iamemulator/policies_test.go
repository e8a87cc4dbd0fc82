package iamemulator_test

import (
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

func TestPolicyLifecycle(t *testing.T) {
	e := newEnv(t, iamemulator.Options{AccountID: "123456789012"}, 1)
	c := ctx(t)

	created := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{
		PolicyName:     aws.String("app-read"),
		Path:           aws.String("/quartermaster/"),
		PolicyDocument: aws.String(policyDoc),
		Description:    aws.String("read the bucket"),
		Tags:           []types.Tag{{Key: aws.String("owner"), Value: aws.String("team-a")}},
	})).ok(t).Policy
	arn := "arn:aws:iam::123456789012:policy/quartermaster/app-read"
	if aws.ToString(created.Arn) != arn {
		t.Fatalf("Arn = %q, want %q", aws.ToString(created.Arn), arn)
	}
	if !regexp.MustCompile(`^ANPA[A-Z0-9]{17}$`).MatchString(aws.ToString(created.PolicyId)) {
		t.Errorf("PolicyId = %q, want ANPA + 17 characters", aws.ToString(created.PolicyId))
	}
	if aws.ToString(created.DefaultVersionId) != "v1" || aws.ToString(created.Path) != "/quartermaster/" ||
		!created.IsAttachable || created.CreateDate == nil || created.CreateDate.IsZero() {
		t.Errorf("unexpected created policy: %+v", created)
	}

	got := must(e.iam.GetPolicy(c, &iam.GetPolicyInput{PolicyArn: aws.String(arn)})).ok(t).Policy
	if aws.ToString(got.Description) != "read the bucket" || aws.ToString(got.PolicyName) != "app-read" ||
		len(got.Tags) != 1 || aws.ToString(got.Tags[0].Key) != "owner" || aws.ToString(got.Tags[0].Value) != "team-a" ||
		aws.ToInt32(got.AttachmentCount) != 0 {
		t.Errorf("unexpected GetPolicy result: %+v", got)
	}

	// Real IAM returns documents percent-encoded, and the SDK does not decode them.
	v1 := must(e.iam.GetPolicyVersion(c, &iam.GetPolicyVersionInput{PolicyArn: aws.String(arn), VersionId: aws.String("v1")})).ok(t).PolicyVersion
	raw := aws.ToString(v1.Document)
	if strings.ContainsAny(raw, "{} \n\":") || !strings.HasPrefix(raw, "%7B%0A%20%20%22Version%22") {
		t.Fatalf("Document is not percent-encoded like IAM: %q", raw)
	}
	if dec, err := url.QueryUnescape(raw); err != nil || dec != policyDoc {
		t.Fatalf("QueryUnescape(Document) = %q, %v; want the submitted document", dec, err)
	}
	if !v1.IsDefaultVersion {
		t.Error("v1 should be the default version")
	}

	_, err := e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("APP-READ"), PolicyDocument: aws.String(policyDoc)})
	wantErr[*types.EntityAlreadyExistsException](t, err, "EntityAlreadyExists")

	// Versions: v2..v5, the sixth is over IAM's limit of five.
	for i := 2; i <= 5; i++ {
		out := must(e.iam.CreatePolicyVersion(c, &iam.CreatePolicyVersionInput{
			PolicyArn: aws.String(arn), PolicyDocument: aws.String(docVersion(strconv.Itoa(i))), SetAsDefault: i == 3,
		})).ok(t)
		if want := "v" + strconv.Itoa(i); aws.ToString(out.PolicyVersion.VersionId) != want || out.PolicyVersion.IsDefaultVersion != (i == 3) {
			t.Fatalf("CreatePolicyVersion #%d = %+v, want %s", i, out.PolicyVersion, want)
		}
	}
	_, err = e.iam.CreatePolicyVersion(c, &iam.CreatePolicyVersionInput{PolicyArn: aws.String(arn), PolicyDocument: aws.String(docVersion("6"))})
	wantErr[*types.LimitExceededException](t, err, "LimitExceeded")

	versions := must(e.iam.ListPolicyVersions(c, &iam.ListPolicyVersionsInput{PolicyArn: aws.String(arn)})).ok(t).Versions
	if len(versions) != 5 {
		t.Fatalf("ListPolicyVersions returned %d versions, want 5", len(versions))
	}
	for _, v := range versions {
		if v.IsDefaultVersion != (aws.ToString(v.VersionId) == "v3") {
			t.Errorf("version %s IsDefaultVersion = %v", aws.ToString(v.VersionId), v.IsDefaultVersion)
		}
	}
	if aws.ToString(must(e.iam.GetPolicy(c, &iam.GetPolicyInput{PolicyArn: aws.String(arn)})).ok(t).Policy.DefaultVersionId) != "v3" {
		t.Error("DefaultVersionId should be v3 after SetAsDefault")
	}

	_, err = e.iam.DeletePolicyVersion(c, &iam.DeletePolicyVersionInput{PolicyArn: aws.String(arn), VersionId: aws.String("v3")})
	wantErr[*types.DeleteConflictException](t, err, "DeleteConflict")
	_, err = e.iam.DeletePolicy(c, &iam.DeletePolicyInput{PolicyArn: aws.String(arn)})
	wantErr[*types.DeleteConflictException](t, err, "DeleteConflict")
	_, err = e.iam.GetPolicyVersion(c, &iam.GetPolicyVersionInput{PolicyArn: aws.String(arn), VersionId: aws.String("v9")})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")

	// Version IDs keep counting after a deletion, as in IAM.
	must(e.iam.DeletePolicyVersion(c, &iam.DeletePolicyVersionInput{PolicyArn: aws.String(arn), VersionId: aws.String("v2")})).ok(t)
	v6 := must(e.iam.CreatePolicyVersion(c, &iam.CreatePolicyVersionInput{PolicyArn: aws.String(arn), PolicyDocument: aws.String(docVersion("6"))})).ok(t)
	if aws.ToString(v6.PolicyVersion.VersionId) != "v6" {
		t.Errorf("version after deleting v2 = %s, want v6", aws.ToString(v6.PolicyVersion.VersionId))
	}
	must(e.iam.SetDefaultPolicyVersion(c, &iam.SetDefaultPolicyVersionInput{PolicyArn: aws.String(arn), VersionId: aws.String("v6")})).ok(t)
	v6doc := must(e.iam.GetPolicyVersion(c, &iam.GetPolicyVersionInput{PolicyArn: aws.String(arn), VersionId: aws.String("v6")})).ok(t).PolicyVersion
	if dec, _ := url.QueryUnescape(aws.ToString(v6doc.Document)); dec != docVersion("6") || !v6doc.IsDefaultVersion {
		t.Errorf("v6 = %+v (decoded %q)", v6doc, dec)
	}

	for _, v := range []string{"v1", "v3", "v4", "v5"} {
		must(e.iam.DeletePolicyVersion(c, &iam.DeletePolicyVersionInput{PolicyArn: aws.String(arn), VersionId: aws.String(v)})).ok(t)
	}
	must(e.iam.DeletePolicy(c, &iam.DeletePolicyInput{PolicyArn: aws.String(arn)})).ok(t)
	_, err = e.iam.GetPolicy(c, &iam.GetPolicyInput{PolicyArn: aws.String(arn)})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
	if !strings.Contains(err.Error(), arn+" does not exist") {
		t.Errorf("NoSuchEntity message %q should name the ARN", err.Error())
	}
	_, err = e.iam.DeletePolicy(c, &iam.DeletePolicyInput{PolicyArn: aws.String(arn)})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
	if n := len(e.emu.State().Policies); n != 0 {
		t.Errorf("state has %d policies after deletion", n)
	}
}

func TestMalformedPolicyDocument(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	pol := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("ok"), PolicyDocument: aws.String(policyDoc)})).ok(t).Policy
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("ok"), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)

	bad := map[string]string{
		"not JSON":          `{"Version": "2012-10-17", "Statement": [`,
		"not an object":     `["Version", "Statement"]`,
		"missing Version":   `{"Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}`,
		"missing Statement": `{"Version":"2012-10-17"}`,
		"scalar Statement":  `{"Version":"2012-10-17","Statement":"Allow"}`,
	}
	for name, doc := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("bad"), PolicyDocument: aws.String(doc)})
			wantErr[*types.MalformedPolicyDocumentException](t, err, "MalformedPolicyDocument")
			_, err = e.iam.CreatePolicyVersion(c, &iam.CreatePolicyVersionInput{PolicyArn: pol.Arn, PolicyDocument: aws.String(doc)})
			wantErr[*types.MalformedPolicyDocumentException](t, err, "MalformedPolicyDocument")
			_, err = e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("bad"), AssumeRolePolicyDocument: aws.String(doc)})
			wantErr[*types.MalformedPolicyDocumentException](t, err, "MalformedPolicyDocument")
			_, err = e.iam.UpdateAssumeRolePolicy(c, &iam.UpdateAssumeRolePolicyInput{RoleName: aws.String("ok"), PolicyDocument: aws.String(doc)})
			wantErr[*types.MalformedPolicyDocumentException](t, err, "MalformedPolicyDocument")
		})
	}
	st := e.emu.State()
	if len(st.Policies) != 1 || len(st.Policies[0].Versions) != 1 || len(st.Roles) != 1 || st.Roles[0].AssumeRolePolicyDocument != trustDoc {
		t.Errorf("rejected documents changed state: %+v", st)
	}

	big := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"` + strings.Repeat("a", 7000) + `"}]}`
	_, err := e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("big"), PolicyDocument: aws.String(big)})
	wantErr[*types.LimitExceededException](t, err, "LimitExceeded")
}

func TestPolicyTags(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	arn := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{
		PolicyName: aws.String("tagged"), PolicyDocument: aws.String(policyDoc),
		Tags: []types.Tag{{Key: aws.String("a"), Value: aws.String("1")}},
	})).ok(t).Policy.Arn

	must(e.iam.TagPolicy(c, &iam.TagPolicyInput{PolicyArn: arn, Tags: []types.Tag{
		{Key: aws.String("A"), Value: aws.String("2")}, // keys are case-insensitive: overwrites "a"
		{Key: aws.String("b"), Value: aws.String("3")},
		{Key: aws.String("c"), Value: aws.String("")},
	}})).ok(t)
	must(e.iam.UntagPolicy(c, &iam.UntagPolicyInput{PolicyArn: arn, TagKeys: []string{"C", "missing"}})).ok(t)
	tags := must(e.iam.ListPolicyTags(c, &iam.ListPolicyTagsInput{PolicyArn: arn})).ok(t).Tags
	if got := tagString(tags); got != "A=2,b=3" {
		t.Errorf("tags = %s, want A=2,b=3", got)
	}

	_, err := e.iam.TagPolicy(c, &iam.TagPolicyInput{PolicyArn: arn, Tags: []types.Tag{
		{Key: aws.String("x"), Value: aws.String("1")}, {Key: aws.String("X"), Value: aws.String("2")},
	}})
	wantErr[*types.InvalidInputException](t, err, "InvalidInput")

	many := make([]types.Tag, 49)
	for i := range many {
		many[i] = types.Tag{Key: aws.String("k" + strconv.Itoa(i)), Value: aws.String("v")}
	}
	_, err = e.iam.TagPolicy(c, &iam.TagPolicyInput{PolicyArn: arn, Tags: many})
	wantErr[*types.LimitExceededException](t, err, "LimitExceeded")

	_, err = e.iam.ListPolicyTags(c, &iam.ListPolicyTagsInput{PolicyArn: aws.String("arn:aws:iam::000000000000:policy/nope")})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
}

func tagString(tags []types.Tag) string {
	parts := make([]string, 0, len(tags))
	for _, t := range tags {
		parts = append(parts, aws.ToString(t.Key)+"="+aws.ToString(t.Value))
	}
	return strings.Join(parts, ",")
}
