package iamemulator_test

import (
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

// TestServiceLastAccessed: a job runs IN_PROGRESS then COMPLETED, reporting each service the
// role's policies grant (managed and inline) with its last use, and for tracked services each
// action; a failed job says why; ListPoliciesGrantingServiceAccess names the policies that grant
// a service; unknown roles and jobs are NoSuchEntity.
func TestServiceLastAccessed(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	role := must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("app"), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t).Role
	pol := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("data"), PolicyDocument: aws.String(
		`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetObject","s3:PutObject","sqs:SendMessage"],"Resource":"*"}]}`)})).ok(t).Policy
	must(e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String("app"), PolicyArn: pol.Arn})).ok(t)
	must(e.iam.PutRolePolicy(c, &iam.PutRolePolicyInput{RoleName: aws.String("app"), PolicyName: aws.String("logs"), PolicyDocument: aws.String(
		`{"Version":"2012-10-17","Statement":{"Effect":"Allow","Action":"logs:*","Resource":"*"}}`)})).ok(t)
	used := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	e.emu.RecordAccess(aws.ToString(role.Arn), "s3:GetObject", used)
	e.emu.SetJobPolls(2)

	job := must(e.iam.GenerateServiceLastAccessedDetails(c, &iam.GenerateServiceLastAccessedDetailsInput{Arn: role.Arn, Granularity: types.AccessAdvisorUsageGranularityTypeActionLevel})).ok(t).JobId
	var out *iam.GetServiceLastAccessedDetailsOutput
	for i := range 3 {
		out = must(e.iam.GetServiceLastAccessedDetails(c, &iam.GetServiceLastAccessedDetailsInput{JobId: job})).ok(t)
		if want := map[bool]types.JobStatusType{true: types.JobStatusTypeInProgress, false: types.JobStatusTypeCompleted}[i < 2]; out.JobStatus != want {
			t.Fatalf("poll %d: %s, want %s", i, out.JobStatus, want)
		}
	}
	got := map[string]*types.ServiceLastAccessed{}
	for i, s := range out.ServicesLastAccessed {
		got[aws.ToString(s.ServiceNamespace)] = &out.ServicesLastAccessed[i]
	}
	if len(got) != 3 || got["s3"] == nil || got["sqs"] == nil || got["logs"] == nil {
		t.Fatalf("services %v", got)
	}
	if s3 := got["s3"]; !aws.ToTime(s3.LastAuthenticated).Equal(used) || len(s3.TrackedActionsLastAccessed) != 2 {
		t.Errorf("s3: %+v", s3)
	} else if a := s3.TrackedActionsLastAccessed; aws.ToString(a[0].ActionName) != "GetObject" || !aws.ToTime(a[0].LastAccessedTime).Equal(used) || a[1].LastAccessedTime != nil {
		t.Errorf("s3 actions: %+v", a)
	}
	if got["sqs"].LastAuthenticated != nil || got["sqs"].TrackedActionsLastAccessed != nil {
		t.Errorf("sqs never used: %+v", got["sqs"])
	}

	granting := must(e.iam.ListPoliciesGrantingServiceAccess(c, &iam.ListPoliciesGrantingServiceAccessInput{Arn: role.Arn, ServiceNamespaces: []string{"sqs", "logs"}})).ok(t)
	var names []string
	for _, entry := range granting.PoliciesGrantingServiceAccess {
		for _, p := range entry.Policies {
			names = append(names, aws.ToString(entry.ServiceNamespace)+"="+aws.ToString(p.PolicyName)+"/"+string(p.PolicyType))
		}
	}
	if !slices.Equal(names, []string{"sqs=data/MANAGED", "logs=logs/INLINE"}) {
		t.Errorf("policies granting: %v", names)
	}

	e.emu.FailJobs(1)
	e.emu.SetJobPolls(0)
	failed := must(e.iam.GenerateServiceLastAccessedDetails(c, &iam.GenerateServiceLastAccessedDetailsInput{Arn: role.Arn})).ok(t).JobId
	must(e.iam.GetServiceLastAccessedDetails(c, &iam.GetServiceLastAccessedDetailsInput{JobId: failed})).ok(t) // IN_PROGRESS
	out = must(e.iam.GetServiceLastAccessedDetails(c, &iam.GetServiceLastAccessedDetailsInput{JobId: failed})).ok(t)
	if out.JobStatus != types.JobStatusTypeFailed || out.Error == nil || aws.ToString(out.Error.Message) == "" {
		t.Errorf("a failed job: %s %+v", out.JobStatus, out.Error)
	}
	_, err := e.iam.GenerateServiceLastAccessedDetails(c, &iam.GenerateServiceLastAccessedDetailsInput{Arn: aws.String("arn:aws:iam::000000000000:role/nope")})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
	_, err = e.iam.GetServiceLastAccessedDetails(c, &iam.GetServiceLastAccessedDetailsInput{JobId: aws.String("00000000-0000-0000-0000-000000000000")})
	wantErr[*types.NoSuchEntityException](t, err, "NoSuchEntity")
}
