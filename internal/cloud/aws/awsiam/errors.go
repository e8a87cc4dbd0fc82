package awsiam

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
)

// Error is an error of one adapter call. Its message names the service, the operation and
// the resource, then the AWS error code and message, for example
//
//	iam GetRole "eks-sa-x": NoSuchEntity: The role with name eks-sa-x cannot be found. (HTTP 404, request id 1f0…)
//
// It unwraps to the SDK's error, so errors.As finds the smithy.APIError, the typed IAM
// exceptions and *awshttp.ResponseError. Messages never carry credentials: the SDK's
// errors hold neither request bodies nor signing keys.
type Error struct {
	Service   string   // "iam", "sts" or "eks"
	Operation string   // the API action, e.g. "GetRole"
	Resource  []string // role names, policy ARNs, version IDs the call was about
	Err       error
}

func (e *Error) Error() string { return e.format(true) }

// StatusMessage is err's message without the request ID, so that an object's status shows the
// same text for the same failure and is not rewritten at every retry.
func StatusMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.format(false)
	}
	return err.Error()
}

func (e *Error) format(withRequestID bool) string {
	var b strings.Builder
	b.WriteString(e.Service)
	b.WriteByte(' ')
	b.WriteString(e.Operation)
	for _, r := range e.Resource {
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(r))
	}
	b.WriteString(": ")
	var apiErr smithy.APIError
	if !errors.As(e.Err, &apiErr) {
		b.WriteString(e.Err.Error())
		return b.String()
	}
	b.WriteString(apiErr.ErrorCode())
	if msg := apiErr.ErrorMessage(); msg != "" {
		b.WriteString(": ")
		b.WriteString(msg)
	}
	var details []string
	var respErr *awshttp.ResponseError
	if errors.As(e.Err, &respErr) {
		details = append(details, "HTTP "+strconv.Itoa(respErr.HTTPStatusCode()))
		if id := respErr.ServiceRequestID(); id != "" && withRequestID {
			details = append(details, "request id "+id)
		}
	}
	var maxErr *retry.MaxAttemptsError
	if errors.As(e.Err, &maxErr) {
		details = append(details, "after "+strconv.Itoa(maxErr.Attempt)+" attempts")
	}
	var quota ratelimit.QuotaExceededError
	if errors.As(e.Err, &quota) {
		details = append(details, "client-side retry quota exceeded")
	}
	if len(details) > 0 {
		b.WriteString(" (")
		b.WriteString(strings.Join(details, ", "))
		b.WriteByte(')')
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// wrap returns nil for a nil err and an *Error otherwise.
func wrap(service, op string, err error, resource ...string) error {
	if err == nil {
		return nil
	}
	return &Error{Service: service, Operation: op, Resource: resource, Err: err}
}

func iamErr(op string, err error, resource ...string) error { return wrap("iam", op, err, resource...) }

// ErrorCode returns the AWS error code of err (smithy.APIError's ErrorCode, such as
// "NoSuchEntity" or "Throttling"), or "" when err is not an API error.
func ErrorCode(err error) string {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode()
	}
	return ""
}

// IsNotFound reports whether err is IAM's NoSuchEntity.
func IsNotFound(err error) bool { return ErrorCode(err) == "NoSuchEntity" }

// IsAlreadyExists reports whether err is IAM's EntityAlreadyExists.
func IsAlreadyExists(err error) bool { return ErrorCode(err) == "EntityAlreadyExists" }

// IsConflict reports whether err is IAM's DeleteConflict (a role with attached policies, a
// policy still attached or with non-default versions, a default version).
func IsConflict(err error) bool { return ErrorCode(err) == "DeleteConflict" }

// serverErrorCodes are error codes of server-side failures that AWS may answer with a
// status other than 5xx.
var serverErrorCodes = map[string]bool{
	"ServiceUnavailable": true, "ServiceUnavailableException": true,
	"InternalFailure": true, "InternalError": true, "InternalServerError": true, "ServiceFailure": true,
}

// IsThrottleOrServer reports whether err is worth retrying later with backoff: throttling
// (the SDK's list of throttling codes, such as Throttling and RequestLimitExceeded),
// transient codes (RequestTimeout), server errors (HTTP 5xx, ServiceUnavailable,
// ServiceFailure), network errors and timeouts. A cancelled context, a TLS certificate
// error and an unknown host name are not: they need a person to fix them.
func IsThrottleOrServer(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	code := ErrorCode(err)
	_, throttle := retry.DefaultThrottleErrorCodes[code]
	_, transient := retry.DefaultRetryableErrorCodes[code]
	if throttle || transient || serverErrorCodes[code] {
		return true
	}
	var respErr *awshttp.ResponseError
	if errors.As(err, &respErr) && respErr.HTTPStatusCode() >= 500 {
		return true
	}
	if code != "" {
		return false
	}
	if isPermanentTransportError(err) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	return retry.RetryableConnectionError{}.IsErrorRetryable(err) == aws.TrueTernary
}

// isPermanentTransportError reports transport errors that waiting does not fix: an
// untrusted or mismatched TLS certificate and a host name that does not exist. (The SDK
// still retries them, since it retries every failure to send a request.)
func isPermanentTransportError(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		invalidCert      x509.CertificateInvalidError
		hostname         x509.HostnameError
		verification     *tls.CertificateVerificationError
		dnsErr           *net.DNSError
	)
	return errors.As(err, &unknownAuthority) || errors.As(err, &invalidCert) || errors.As(err, &hostname) ||
		errors.As(err, &verification) || (errors.As(err, &dnsErr) && dnsErr.IsNotFound)
}
