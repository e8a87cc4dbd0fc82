package iamemulator_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/smithy-go"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

func TestFaultInjectionAtRateOne(t *testing.T) {
	for _, tc := range []struct {
		kind   iamemulator.FaultKind
		code   string
		status int
	}{
		{iamemulator.FaultThrottle, "Throttling", http.StatusBadRequest},
		{iamemulator.Fault5xx, "ServiceUnavailable", http.StatusServiceUnavailable},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			// Three attempts: the SDK's standard retryer must classify the fault as retryable.
			e := newEnv(t, iamemulator.Options{FailRate: 1, FailKinds: []iamemulator.FaultKind{tc.kind}}, 3)
			c := ctx(t)
			_, err := e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("p"), PolicyDocument: aws.String(policyDoc)})
			var apiErr smithy.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode() != tc.code {
				t.Fatalf("want API error %s, got %v", tc.code, err)
			}
			var respErr *awshttp.ResponseError
			if !errors.As(err, &respErr) || respErr.HTTPStatusCode() != tc.status {
				t.Fatalf("want HTTP %d, got %v", tc.status, err)
			}
			st := e.emu.State()
			if st.Calls["CreatePolicy"] != 3 || st.Faults["CreatePolicy"] != 3 {
				t.Errorf("calls=%d faults=%d, want 3 attempts, all faulted", st.Calls["CreatePolicy"], st.Faults["CreatePolicy"])
			}
			if len(st.Policies) != 0 {
				t.Errorf("a faulted request changed state: %+v", st.Policies)
			}
		})
	}
}

func TestFaultInjectionRetriedBySDK(t *testing.T) {
	// 30% of requests fail; the SDK's standard retryer (10 attempts here) must still succeed.
	e := newEnv(t, iamemulator.Options{FailRate: 0.3, Seed: 42}, 10)
	c := ctx(t)
	const n = 40
	for i := range n {
		name := fmt.Sprintf("p-%02d", i)
		arn := must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String(name), PolicyDocument: aws.String(policyDoc)})).ok(t).Policy.Arn
		must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String(name), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)
		must(e.iam.AttachRolePolicy(c, &iam.AttachRolePolicyInput{RoleName: aws.String(name), PolicyArn: arn})).ok(t)
	}
	st := e.emu.State()
	if len(st.Policies) != n || len(st.Roles) != n {
		t.Fatalf("state has %d policies and %d roles, want %d each", len(st.Policies), len(st.Roles), n)
	}
	faults := 0
	for _, f := range st.Faults {
		faults += f
	}
	if faults == 0 {
		t.Fatal("no faults were injected at rate 0.3")
	}
	if st.Total != 3*n+faults {
		t.Errorf("total calls %d, want %d successful + %d faulted", st.Total, 3*n, faults)
	}
	t.Logf("%d calls, %d injected faults", st.Total, faults)

	// Faults can be switched off at run time.
	e.emu.SetFaults(0, nil)
	before := e.emu.TotalCalls()
	must(e.iam.GetRole(c, &iam.GetRoleInput{RoleName: aws.String("p-00")})).ok(t)
	if got := e.emu.TotalCalls() - before; got != 1 {
		t.Errorf("GetRole took %d calls with faults off, want 1", got)
	}
}
