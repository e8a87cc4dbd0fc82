package iamemulator

import (
	"net/http"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
)

// HTTPClient returns an HTTP client for AWS SDK clients that talk to the emulator over
// loopback (set it as aws.Config.HTTPClient or iam.Options.HTTPClient). It is
// awsiam.HTTPClient, which buffers request bodies to work around a client-side race
// between smithy-go and net/http (aws/aws-sdk-go-v2#2737) that a server on loopback loses
// on most large list responses.
func HTTPClient() *http.Client { return awsiam.HTTPClient() }
