package iamemulator_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/smithy-go"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

const (
	trustDoc = `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}`
	// policyDoc has spaces, a newline, quotes, slashes and colons to exercise percent-encoding.
	policyDoc = "{\n  \"Version\": \"2012-10-17\",\n  \"Statement\": [{\"Effect\": \"Allow\", \"Action\": \"s3:GetObject\", \"Resource\": \"arn:aws:s3:::bucket/a b+c\"}]\n}"
)

func docVersion(n string) string {
	return `{"Version":"2012-10-17","Statement":[{"Sid":"V` + n + `","Effect":"Allow","Action":"s3:ListBucket","Resource":"*"}]}`
}

type env struct {
	emu *iamemulator.Server
	url string
	cfg aws.Config
	iam *iam.Client
}

// newEnv starts the emulator in-process and returns a real SDK client pointed at it. The
// client uses the SDK's standard retryer with up to maxAttempts attempts and a tiny backoff
// so that fault-injection tests stay fast.
func newEnv(t *testing.T, opts iamemulator.Options, maxAttempts int) *env {
	t.Helper()
	emu := iamemulator.New(opts)
	ts := httptest.NewServer(emu)
	t.Cleanup(ts.Close)
	cfg := iamemulator.SDKConfig(ts.URL, iamemulator.FixedBackoff(time.Millisecond),
		func(o *retry.StandardOptions) { o.MaxAttempts = maxAttempts })
	return &env{emu: emu, url: ts.URL, cfg: cfg, iam: iam.NewFromConfig(cfg)}
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// wantErr asserts that err is (or wraps) the SDK's typed error T with the given error code.
func wantErr[T smithy.APIError](t *testing.T, err error, code string) {
	t.Helper()
	var typed T
	if !errors.As(err, &typed) {
		t.Fatalf("want %T (%s), got %T: %v", typed, code, err, err)
	}
	if typed.ErrorCode() != code {
		t.Fatalf("want error code %s, got %s (%v)", code, typed.ErrorCode(), err)
	}
}

// result carries an SDK call's return values so that must(client.Op(…)).ok(t) reads as one line.
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
