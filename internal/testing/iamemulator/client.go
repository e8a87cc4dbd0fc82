package iamemulator

import (
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
)

// The credentials and region of SDKConfig. The SDK signs every request, and needs a region to sign
// with; the emulator accepts any signature. The secret is AWS's documented example key, so a test
// can check that no message carries it.
const (
	AccessKeyID     = "AKIDEXAMPLE"
	SecretAccessKey = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	Region          = "us-east-1"
)

// HTTPClient returns an HTTP client for AWS SDK clients that talk to the emulator over
// loopback (set it as aws.Config.HTTPClient or iam.Options.HTTPClient). It is
// awsiam.HTTPClient, which buffers request bodies to work around a client-side race
// between smithy-go and net/http (aws/aws-sdk-go-v2#2737) that a server on loopback loses
// on most large list responses.
func HTTPClient() *http.Client { return awsiam.HTTPClient() }

// SDKConfig is the AWS SDK configuration of IAM, STS and EKS clients of the emulator served at url:
// its endpoint, AccessKeyID and SecretAccessKey, Region, HTTPClient, and the operator's retryer
// (awsiam.NewRetryer) with retryOpts applied (tests shorten the backoff with FixedBackoff). A test
// that needs another transport replaces HTTPClient.
func SDKConfig(url string, retryOpts ...func(*retry.StandardOptions)) aws.Config {
	return aws.Config{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, ""),
		BaseEndpoint: aws.String(url),
		HTTPClient:   HTTPClient(),
		Retryer:      func() aws.Retryer { return awsiam.NewRetryer(retryOpts...) },
	}
}

// FixedBackoff keeps the retryer's decisions and attempts but waits d between attempts, so that
// tests of retried faults stay quick.
func FixedBackoff(d time.Duration) func(*retry.StandardOptions) {
	return func(o *retry.StandardOptions) {
		o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return d, nil })
	}
}
