package awsiam

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
)

const (
	// DefaultRegion is the region LoadConfig uses when none is configured. IAM is a global
	// service whose endpoint in the aws partition lives in us-east-1.
	DefaultRegion = "us-east-1"
	// MaxAttempts is how many times the retryer of LoadConfig tries a call (the first try
	// included) when it fails with throttling, a 5xx or a network error.
	MaxAttempts = 5
	// AttemptTimeout bounds one HTTP attempt (of LoadConfig's client and of HTTPClient), so
	// that a hung connection fails and is retried instead of blocking a reconcile forever.
	AttemptTimeout = 30 * time.Second
)

// LoadConfig loads the SDK's standard configuration with config.LoadDefaultConfig: the
// region from AWS_REGION / AWS_DEFAULT_REGION / the shared config file, the default
// credentials chain (environment, shared files, web identity for IRSA, ECS/EC2 roles), and
// endpoint overrides such as AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_IAM and AWS_ENDPOINT_URL_STS,
// which the SDK's clients honour themselves. When no region is configured it uses
// DefaultRegion. It installs NewRetryer, and the SDK's default HTTP client with
// AttemptTimeout and (when configured) AWS_CA_BUNDLE, wrapped by BufferRequestBodies.
func LoadConfig(ctx context.Context) (aws.Config, error) {
	cfg, err := config.LoadDefaultConfig(ctx,
		// The SDK's own buildable client, so that the SDK can still apply AWS_CA_BUNDLE (it
		// refuses any other client type when a CA bundle is configured); the request-body
		// buffering of HTTPClient is wrapped around it afterwards.
		config.WithHTTPClient(awshttp.NewBuildableClient().WithTimeout(AttemptTimeout)),
		config.WithRetryer(func() aws.Retryer { return NewRetryer() }),
	)
	if err != nil {
		return aws.Config{}, fmt.Errorf("loading AWS configuration: %w", err)
	}
	cfg.HTTPClient = BufferRequestBodies(cfg.HTTPClient)
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	return cfg, nil
}

// NewRetryer returns the SDK's standard retryer (it retries throttling, 5xx answers and
// network errors with exponential backoff and jitter) with MaxAttempts attempts and without
// the client-side retry rate limiter: the limiter's token bucket is shared by all calls of a
// client, so a storm of throttling would otherwise turn into "retry quota exceeded" errors
// that are not retried at all. opts are applied last (tests shorten the backoff with them).
func NewRetryer(opts ...func(*retry.StandardOptions)) aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = MaxAttempts
		o.RateLimiter = ratelimit.None
		for _, opt := range opts {
			opt(o)
		}
	})
}

// HTTPClient returns an HTTP client for SDK clients configured by hand (aws.Config.HTTPClient,
// as tests against the IAM emulator do): the SDK's default transport (timeouts, connection
// pool, TLS 1.2+), AttemptTimeout per attempt, and request bodies buffered in memory.
// LoadConfig installs the equivalent client itself.
//
// The buffering works around a client-side race between smithy-go and net/http
// (aws/aws-sdk-go-v2#2737): the SDK closes its request body as soon as the response
// arrives, while the transport may still be probing that body for extra bytes; the probe
// then fails with io.EOF and the transport closes the connection under a response body that
// is still being read ("use of closed network connection"). Real AWS is far enough away to
// lose this race rarely, and the SDK retries it, but a server on loopback (the IAM emulator)
// loses it on most large list responses, which makes call counts unstable. The transport
// here gets an in-memory copy of the body, so the SDK's close cannot disturb it. IAM request
// bodies are small forms (a policy document is at most a few KiB).
func HTTPClient() *http.Client {
	base := awshttp.NewBuildableClient().GetTransport()
	return &http.Client{Transport: bufferedBodyTransport{base: base}, Timeout: AttemptTimeout}
}

// BufferRequestBodies wraps an SDK HTTP client (aws.Config.HTTPClient; the SDK's default
// when nil) so that it sends an in-memory copy of each request body, the workaround that
// HTTPClient describes.
func BufferRequestBodies(c aws.HTTPClient) aws.HTTPClient {
	if c == nil {
		c = awshttp.NewBuildableClient()
	}
	return bufferedBodyClient{base: c}
}

type bufferedBodyClient struct {
	base aws.HTTPClient
}

func (c bufferedBodyClient) Do(req *http.Request) (*http.Response, error) {
	buffered, err := bufferBody(req)
	if err != nil {
		return nil, err
	}
	return c.base.Do(buffered)
}

type bufferedBodyTransport struct {
	base http.RoundTripper
}

func (t bufferedBodyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	buffered, err := bufferBody(req)
	if err != nil {
		return nil, err
	}
	return t.base.RoundTrip(buffered)
}

// bufferBody returns req, or a clone of it whose body is an in-memory copy of req's.
func bufferBody(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, nil
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	clone := req.Clone(req.Context())
	clone.Body = io.NopCloser(bytes.NewReader(body))
	clone.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	clone.ContentLength = int64(len(body))
	return clone, nil
}
