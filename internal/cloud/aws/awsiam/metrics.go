package awsiam

import (
	"context"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"

	"github.com/quartermaster-dev/quartermaster/internal/metrics"
)

// Metered records every operation of a client in quartermaster_external_requests_total and
// _duration_seconds, as one call with its retries: it runs at the initialize step, outside the
// retry loop.
func Metered(service string) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("QuartermasterMetrics",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				start := time.Now()
				out, md, err := next.HandleInitialize(ctx, in)
				result := metrics.ResultOK
				if err != nil {
					result = ErrorCode(err)
					if result == "" {
						result = metrics.ResultError
					}
				}
				metrics.ObserveExternal(service, awsmiddleware.GetOperationName(ctx), result, start)
				return out, md, err
			}), middleware.Before)
	}
}
