package awsiam_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/smithy-go"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

func TestErrorClassification(t *testing.T) {
	c, _, _ := newClient(t, iamemulator.Options{})
	ctx := testCtx(t)
	pol := must(c.CreatePolicy(ctx, awsiam.NewPolicy{Name: "p", Document: policyDoc})).ok(t)
	must(c.CreateRole(ctx, awsiam.NewRole{Name: "r", TrustPolicy: trustDoc})).ok(t)
	noErr(t, c.AttachPolicy(ctx, "r", pol.ARN))

	notFound := second(c.GetRole(ctx, "eks-sa-x"))
	exists := second(c.CreateRole(ctx, awsiam.NewRole{Name: "R", TrustPolicy: trustDoc}))
	conflict := c.DeleteRole(ctx, "r")
	invalid := second(c.CreateRole(ctx, awsiam.NewRole{Name: "bad name", TrustPolicy: trustDoc}))
	malformed := second(c.CreatePolicy(ctx, awsiam.NewPolicy{Name: "m", Document: `{"Statement":[]}`}))

	for _, tc := range []struct {
		name                                   string
		err                                    error
		code                                   string
		notFound, exists, conflict, throttling bool
		prefix                                 string
	}{
		{"NoSuchEntity", notFound, "NoSuchEntity", true, false, false, false,
			`iam GetRole "eks-sa-x": NoSuchEntity: The role with name eks-sa-x cannot be found. (HTTP 404, request id `},
		{"EntityAlreadyExists", exists, "EntityAlreadyExists", false, true, false, false, `iam CreateRole "R": EntityAlreadyExists: `},
		{"DeleteConflict", conflict, "DeleteConflict", false, false, true, false, `iam DeleteRole "r": DeleteConflict: `},
		{"ValidationError", invalid, "ValidationError", false, false, false, false, `iam CreateRole "bad name": ValidationError: `},
		{"MalformedPolicyDocument", malformed, "MalformedPolicyDocument", false, false, false, false, `iam CreatePolicy "m": MalformedPolicyDocument: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil {
				t.Fatal("no error")
			}
			if got := awsiam.ErrorCode(tc.err); got != tc.code {
				t.Errorf("ErrorCode = %q, want %q", got, tc.code)
			}
			if awsiam.IsNotFound(tc.err) != tc.notFound || awsiam.IsAlreadyExists(tc.err) != tc.exists ||
				awsiam.IsConflict(tc.err) != tc.conflict || awsiam.IsThrottleOrServer(tc.err) != tc.throttling {
				t.Errorf("classification of %v: IsNotFound=%v IsAlreadyExists=%v IsConflict=%v IsThrottleOrServer=%v", tc.err,
					awsiam.IsNotFound(tc.err), awsiam.IsAlreadyExists(tc.err), awsiam.IsConflict(tc.err), awsiam.IsThrottleOrServer(tc.err))
			}
			msg := tc.err.Error()
			if !strings.HasPrefix(msg, tc.prefix) {
				t.Errorf("message %q, want prefix %q", msg, tc.prefix)
			}
			if status := awsiam.StatusMessage(tc.err); strings.Contains(status, "request id") || !strings.HasPrefix(msg, strings.TrimSuffix(status, ")")) {
				t.Errorf("StatusMessage %q: want the message without its request id", status)
			}
			if strings.Contains(msg, iamemulator.SecretAccessKey) || strings.Contains(msg, iamemulator.AccessKeyID) {
				t.Errorf("message carries credentials: %q", msg)
			}
			var apiErr smithy.APIError
			var adapterErr *awsiam.Error
			if !errors.As(tc.err, &apiErr) || !errors.As(tc.err, &adapterErr) || adapterErr.Operation == "" {
				t.Errorf("%v does not unwrap to the SDK's APIError and *awsiam.Error", tc.err)
			}
		})
	}
	// The SDK's typed exceptions stay reachable.
	var nse *types.NoSuchEntityException
	if !errors.As(notFound, &nse) {
		t.Errorf("errors.As(*types.NoSuchEntityException) failed for %v", notFound)
	}

	// Errors that are not AWS API errors.
	for _, err := range []error{nil, errors.New("plain"), context.Canceled, fmt.Errorf("wrapped: %w", context.Canceled)} {
		if awsiam.ErrorCode(err) != "" || awsiam.IsNotFound(err) || awsiam.IsAlreadyExists(err) || awsiam.IsConflict(err) || awsiam.IsThrottleOrServer(err) {
			t.Errorf("%v classified as an AWS error", err)
		}
	}
	if !awsiam.IsThrottleOrServer(context.DeadlineExceeded) {
		t.Error("a timeout is not retryable")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.GetRole(cancelled, "r"); err == nil || awsiam.IsThrottleOrServer(err) {
		t.Errorf("a call with a cancelled context: %v, want a non-retryable error", err)
	}
}

func TestNetworkErrorIsRetryable(t *testing.T) {
	// A server that is gone: connection refused on every attempt.
	ts := httptest.NewServer(iamemulator.New(iamemulator.Options{}))
	url := ts.URL
	ts.Close()
	_, _, cfg := newClient(t, iamemulator.Options{})
	cfg.BaseEndpoint = aws.String(url)
	c := awsiam.New(cfg)
	_, err := c.GetRole(testCtx(t), "r")
	if err == nil || !awsiam.IsThrottleOrServer(err) || awsiam.ErrorCode(err) != "" {
		t.Fatalf("connection refused: %v (IsThrottleOrServer=%v), want a retryable non-API error", err, awsiam.IsThrottleOrServer(err))
	}
	if !strings.HasPrefix(err.Error(), `iam GetRole "r": `) {
		t.Errorf("message %q does not name the operation and role", err)
	}
}

func TestFaultsExhaustRetries(t *testing.T) {
	for _, tc := range []struct {
		kind iamemulator.FaultKind
		code string
	}{
		{iamemulator.FaultThrottle, "Throttling"},
		{iamemulator.Fault5xx, "ServiceUnavailable"},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			c, emu, _ := newClient(t, iamemulator.Options{})
			ctx := testCtx(t)
			must(c.CreateRole(ctx, awsiam.NewRole{Name: "r", TrustPolicy: trustDoc})).ok(t)

			emu.SetFaults(1, []iamemulator.FaultKind{tc.kind})
			_, err := c.GetRole(ctx, "r")
			if awsiam.ErrorCode(err) != tc.code || !awsiam.IsThrottleOrServer(err) || awsiam.IsNotFound(err) {
				t.Fatalf("GetRole at fault rate 1: %v, want retryable %s", err, tc.code)
			}
			if n := emu.Calls("GetRole"); n != awsiam.MaxAttempts {
				t.Errorf("GetRole attempts = %d, want %d", n, awsiam.MaxAttempts)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("after %d attempts", awsiam.MaxAttempts)) {
				t.Errorf("message %q does not say how many attempts were made", err)
			}

			emu.SetFaults(0, nil)
			if r := must(c.GetRole(ctx, "r")).ok(t); r.Name != "r" {
				t.Errorf("GetRole after faults stopped = %+v", r)
			}
		})
	}
}

// TestFaultStormDoesNotExhaustRetryQuota: with the SDK's default retry rate limiter, a
// client gives up after about 100 retries ("retry quota exceeded") without calling AWS.
// The adapter's retryer has no limiter, so every call keeps all its attempts.
func TestFaultStormDoesNotExhaustRetryQuota(t *testing.T) {
	c, emu, _ := newClient(t, iamemulator.Options{FailRate: 1, FailKinds: []iamemulator.FaultKind{iamemulator.FaultThrottle}})
	ctx := testCtx(t)
	const calls = 30 // 30 calls × 4 retries = 120 retries, past the default quota of 100
	for i := range calls {
		_, err := c.GetRole(ctx, fmt.Sprintf("r-%d", i))
		var quota ratelimit.QuotaExceededError
		if errors.As(err, &quota) || awsiam.ErrorCode(err) != "Throttling" {
			t.Fatalf("call %d: %v, want Throttling after all attempts", i, err)
		}
	}
	if n := emu.Calls("GetRole"); n != calls*awsiam.MaxAttempts {
		t.Errorf("GetRole requests = %d, want %d", n, calls*awsiam.MaxAttempts)
	}
}

func TestRetriedSuccessUnderFaults(t *testing.T) {
	// 25% of requests fail with throttling or 503; with five attempts every call succeeds
	// (a call fails only if five attempts in a row fail, about 1 in 1000).
	c, emu, _ := newClient(t, iamemulator.Options{FailRate: 0.25, Seed: 7})
	ctx := testCtx(t)
	const n = 15
	for i := range n {
		name := fmt.Sprintf("app-%02d", i)
		p := must(c.CreatePolicy(ctx, awsiam.NewPolicy{Name: name, Document: policyDoc, Tags: awsiam.Tags{"i": name}})).ok(t)
		must(c.CreateRole(ctx, awsiam.NewRole{Name: name, TrustPolicy: trustDoc})).ok(t)
		noErr(t, c.AttachPolicy(ctx, name, p.ARN))
		if got := must(c.GetPolicyDocument(ctx, p.ARN, p.DefaultVersionID)).ok(t); got != policyDoc {
			t.Errorf("document of %s = %q", name, got)
		}
		if got := must(c.ListRolesForPolicy(ctx, p.ARN)).ok(t); len(got) != 1 || got[0] != name {
			t.Errorf("roles of %s = %v", name, got)
		}
	}
	st := emu.State()
	faults := 0
	for _, f := range st.Faults {
		faults += f
	}
	if len(st.Roles) != n || len(st.Policies) != n || faults == 0 {
		t.Errorf("%d roles, %d policies, %d injected faults; want %d, %d, >0", len(st.Roles), len(st.Policies), faults, n, n)
	}
	t.Logf("%d requests, %d injected faults", st.Total, faults)
}
