package vsphere

import (
	"context"
	"reflect"
	"strings"
	"time"

	"github.com/vmware/govmomi/vim25/soap"

	"github.com/quartermaster-dev/quartermaster/internal/metrics"
)

// metered records every SOAP call of a session in quartermaster_external_requests_total and
// _duration_seconds: the operation is the vSphere method (CloneVM_Task, PowerOnVM_Task, …; a
// task's own progress is waited for with WaitForUpdatesEx, a long poll), the result ok, the
// fault's type (InvalidLogin, ManagedObjectNotFound, …) or error when there was no answer.
type metered struct{ next soap.RoundTripper }

func (m metered) RoundTrip(ctx context.Context, req, res soap.HasFault) error {
	start := time.Now()
	err := m.next.RoundTrip(ctx, req, res)
	result := metrics.ResultOK
	switch {
	case err != nil:
		result = metrics.ResultError
		if soap.IsSoapFault(err) {
			result = soapFaultName(soap.ToSoapFault(err))
		}
	case res.Fault() != nil:
		result = soapFaultName(res.Fault())
	}
	metrics.ObserveExternal("vsphere", strings.TrimSuffix(reflect.TypeOf(req).Elem().Name(), "Body"), result, start)
	return err
}

func soapFaultName(f *soap.Fault) string {
	if v := f.VimFault(); v != nil {
		return reflect.Indirect(reflect.ValueOf(v)).Type().Name()
	}
	return "Fault"
}
