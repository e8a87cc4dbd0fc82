package awsiam_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

const (
	trustDoc = `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Federated":"arn:aws:iam::000000000000:oidc-provider/oidc.example.com/id/ABC"},"Action":"sts:AssumeRoleWithWebIdentity","Condition":{"StringEquals":{"oidc.example.com/id/ABC:sub":"system:serviceaccount:team-a:app"}}}]}`
	// policyDoc has spaces, a newline, a plus, a percent sign, quotes, slashes and colons, so
	// that only a correct decoding of IAM's percent-encoding gives it back.
	policyDoc = "{\n  \"Version\": \"2012-10-17\",\n  \"Statement\": [{\"Effect\": \"Allow\", \"Action\": \"s3:GetObject\", \"Resource\": \"arn:aws:s3:::bucket/a b+c%20d\"}]\n}"
)

func docVersion(n string) string {
	return `{"Version":"2012-10-17","Statement":[{"Sid":"V` + n + `","Effect":"Allow","Action":"s3:ListBucket","Resource":"*"}]}`
}

// fastBackoff keeps the SDK's retry decisions and MaxAttempts but waits a millisecond
// between attempts, so that fault tests stay fast.
var fastBackoff = iamemulator.FixedBackoff(time.Millisecond)

// newClient starts the emulator in-process and returns an adapter pointed at it with
// static credentials, the adapter's HTTP client and its retryer (with fastBackoff).
func newClient(t *testing.T, opts iamemulator.Options) (*awsiam.Client, *iamemulator.Server, aws.Config) {
	t.Helper()
	emu := iamemulator.New(opts)
	ts := httptest.NewServer(emu)
	t.Cleanup(ts.Close)
	cfg := iamemulator.SDKConfig(ts.URL, fastBackoff)
	return awsiam.New(cfg), emu, cfg
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// result carries a call's return values so that must(c.Op(…)).ok(t) reads as one line.
type result[T any] struct {
	v   T
	err error
}

func must[T any](v T, err error) result[T] { return result[T]{v: v, err: err} }

// ok fails the test on an error and returns the value otherwise.
func (r result[T]) ok(t *testing.T) T {
	t.Helper()
	if r.err != nil {
		t.Fatalf("unexpected error: %v", r.err)
	}
	return r.v
}

// noErr fails the test on err.
func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
}
