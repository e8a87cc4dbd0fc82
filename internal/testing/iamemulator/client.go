package iamemulator

import (
	"bytes"
	"io"
	"net/http"
)

// HTTPClient returns an HTTP client for AWS SDK clients that talk to the emulator over
// loopback (set it as aws.Config.HTTPClient or iam.Options.HTTPClient).
//
// It works around a client-side race between smithy-go and net/http
// (aws/aws-sdk-go-v2#2737): the SDK closes its request body as soon as the response
// arrives, while the transport may still be probing that body for extra bytes; the probe
// then fails with io.EOF and the transport closes the connection under a response body that
// is still being read ("use of closed network connection"). Real AWS is too far away to
// lose this race often, and the SDK retries it, but a server on loopback loses it on most
// large list responses, which makes call counts unstable. This client hands the transport
// an in-memory copy of the body, so the SDK's close cannot disturb it.
func HTTPClient() *http.Client {
	base := http.DefaultTransport.(*http.Transport).Clone()
	return &http.Client{Transport: bufferedBodyTransport{base: base}}
}

type bufferedBodyTransport struct {
	base http.RoundTripper
}

func (t bufferedBodyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return t.base.RoundTrip(req)
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
	return t.base.RoundTrip(clone)
}
