package awsiam_test

import (
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

// isolateAWSEnv clears the AWS settings of the environment the tests run in (t.Setenv
// restores them) and supplies static credentials, so LoadConfig reads only what a test sets.
func isolateAWSEnv(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_CONFIG_FILE":                     filepath.Join(dir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE":         filepath.Join(dir, "credentials"),
		"AWS_PROFILE":                         "",
		"AWS_DEFAULT_PROFILE":                 "",
		"AWS_REGION":                          "",
		"AWS_DEFAULT_REGION":                  "",
		"AWS_ACCESS_KEY_ID":                   iamemulator.AccessKeyID,
		"AWS_SECRET_ACCESS_KEY":               iamemulator.SecretAccessKey,
		"AWS_SESSION_TOKEN":                   "",
		"AWS_ROLE_ARN":                        "",
		"AWS_WEB_IDENTITY_TOKEN_FILE":         "",
		"AWS_EC2_METADATA_DISABLED":           "true",
		"AWS_ENDPOINT_URL":                    "",
		"AWS_ENDPOINT_URL_IAM":                "",
		"AWS_ENDPOINT_URL_STS":                "",
		"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "",
		"AWS_MAX_ATTEMPTS":                    "",
		"AWS_CA_BUNDLE":                       "",
		"AWS_RETRY_MODE":                      "",
	} {
		t.Setenv(k, v)
	}
}

func TestLoadConfigHonoursServiceEndpointsAndDefaultsRegion(t *testing.T) {
	isolateAWSEnv(t)
	emu := iamemulator.New(iamemulator.Options{AccountID: "123456789012"})
	ts := httptest.NewServer(emu)
	t.Cleanup(ts.Close)
	// The general endpoint leads nowhere: only the service-specific ones reach the emulator.
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
	t.Setenv("AWS_ENDPOINT_URL_IAM", ts.URL)
	t.Setenv("AWS_ENDPOINT_URL_STS", ts.URL)

	cfg, err := awsiam.LoadConfig(testCtx(t))
	noErr(t, err)
	if cfg.Region != awsiam.DefaultRegion {
		t.Errorf("Region = %q, want the fallback %q", cfg.Region, awsiam.DefaultRegion)
	}
	if cfg.Retryer == nil || cfg.Retryer().MaxAttempts() != awsiam.MaxAttempts {
		t.Errorf("retryer does not make %d attempts", awsiam.MaxAttempts)
	}
	if cfg.HTTPClient == nil {
		t.Error("no HTTP client configured")
	}

	c := awsiam.New(cfg)
	ctx := testCtx(t)
	must(c.CreateRole(ctx, awsiam.NewRole{Name: "via-env", TrustPolicy: trustDoc})).ok(t)
	if r := must(c.GetRole(ctx, "via-env")).ok(t); r.ARN != "arn:aws:iam::123456789012:role/via-env" {
		t.Errorf("GetRole through AWS_ENDPOINT_URL_IAM = %+v", r)
	}
	if id := must(c.AccountID(ctx)).ok(t); id != "123456789012" {
		t.Errorf("AccountID through AWS_ENDPOINT_URL_STS = %q", id)
	}
	if emu.Calls("CreateRole") != 1 || emu.Calls("GetRole") != 1 || emu.Calls("GetCallerIdentity") != 1 {
		t.Errorf("emulator calls = %v", emu.State().Calls)
	}
}

func TestLoadConfigHonoursRegionAndGeneralEndpoint(t *testing.T) {
	isolateAWSEnv(t)
	emu := iamemulator.New(iamemulator.Options{})
	ts := httptest.NewServer(emu)
	t.Cleanup(ts.Close)
	t.Setenv("AWS_REGION", "eu-west-1")
	t.Setenv("AWS_ENDPOINT_URL", ts.URL)

	cfg, err := awsiam.LoadConfig(testCtx(t))
	noErr(t, err)
	if cfg.Region != "eu-west-1" {
		t.Errorf("Region = %q, want eu-west-1 from AWS_REGION", cfg.Region)
	}
	if id := must(awsiam.New(cfg).AccountID(testCtx(t))).ok(t); id != iamemulator.DefaultAccountID || emu.Calls("GetCallerIdentity") != 1 {
		t.Errorf("AccountID through AWS_ENDPOINT_URL = %q (%d calls)", id, emu.Calls("GetCallerIdentity"))
	}
}

// TestLoadConfigHonoursCABundle: the SDK applies AWS_CA_BUNDLE only to its own HTTP client
// type, so LoadConfig must keep that type under its body buffering. The emulator serves
// HTTPS with a self-signed certificate that only the bundle makes trusted.
func TestLoadConfigHonoursCABundle(t *testing.T) {
	isolateAWSEnv(t)
	emu := iamemulator.New(iamemulator.Options{})
	ts := httptest.NewTLSServer(emu)
	t.Cleanup(ts.Close)
	bundle := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	noErr(t, os.WriteFile(bundle, pemBytes, 0o600))
	t.Setenv("AWS_ENDPOINT_URL_IAM", ts.URL)

	// Without the bundle the certificate is not trusted. (The SDK retries even that, so the
	// backoff is shortened; the error is not classified as worth retrying.)
	cfg, err := awsiam.LoadConfig(testCtx(t))
	noErr(t, err)
	cfg.Retryer = func() aws.Retryer { return awsiam.NewRetryer(fastBackoff) }
	if _, err := awsiam.New(cfg).GetRole(testCtx(t), "r"); err == nil || awsiam.ErrorCode(err) != "" || awsiam.IsThrottleOrServer(err) {
		t.Fatalf("GetRole over untrusted TLS: %v (IsThrottleOrServer=%v), want a permanent TLS error", err, awsiam.IsThrottleOrServer(err))
	}

	t.Setenv("AWS_CA_BUNDLE", bundle)
	cfg, err = awsiam.LoadConfig(testCtx(t))
	noErr(t, err)
	c := awsiam.New(cfg)
	ctx := testCtx(t)
	must(c.CreateRole(ctx, awsiam.NewRole{Name: "r", TrustPolicy: trustDoc})).ok(t)
	if r := must(c.GetRole(ctx, "r")).ok(t); r.TrustPolicy != trustDoc {
		t.Errorf("GetRole over TLS = %+v", r)
	}
}
