package vsimtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmware/govmomi/property"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// Linked clones: vcsim v0.56.0 ignores a clone spec's snapshot and disk move type (every clone is a
// copy), so the Sim's wrapper plays vCenter's part: a clone whose disks are to be new children of a
// snapshot's (createNewChildDiskBacking) must name a snapshot of the VM it clones, or it fails as
// vCenter fails it (InvalidArgument on spec.snapshot); and it counts the clones of each kind.

// clones counts the clones the Sim carried out, by kind.
type clones struct{ full, linked atomic.Int64 }

// Clones returns how many full and linked clones the Sim carried out.
func (s *Sim) Clones() (full, linked int) {
	return int(s.clones.full.Load()), int(s.clones.linked.Load())
}

// checkClone is the wrapper's look at a clone request before vcsim carries it out: nil to go on,
// or the fault vCenter answers.
func (s *Sim) checkClone(ctx context.Context, req *methods.CloneVM_TaskBody) error {
	spec := req.Req.Spec
	if spec.Location.DiskMoveType != string(types.VirtualMachineRelocateDiskMoveOptionsCreateNewChildDiskBacking) {
		s.clones.full.Add(1)
		return nil
	}
	invalid := func(msg string) error {
		fault := &soap.Fault{Code: "ServerFaultCode", String: msg}
		fault.Detail.Fault = &types.InvalidArgument{InvalidProperty: "spec.snapshot"}
		return soap.WrapSoapFault(fault)
	}
	if spec.Snapshot == nil {
		return invalid("a linked clone names no snapshot")
	}
	var vm mo.VirtualMachine
	if err := property.DefaultCollector(s.unwrapped).RetrieveOne(ctx, req.Req.This, []string{"snapshot"}, &vm); err != nil {
		return err
	}
	if vm.Snapshot == nil || !inTree(vm.Snapshot.RootSnapshotList, *spec.Snapshot) {
		return invalid(fmt.Sprintf("snapshot %s is not a snapshot of %s", spec.Snapshot.Value, req.Req.This.Value))
	}
	s.clones.linked.Add(1)
	return nil
}

func inTree(trees []types.VirtualMachineSnapshotTree, ref types.ManagedObjectReference) bool {
	for _, t := range trees {
		if t.Snapshot == ref || inTree(t.ChildSnapshotList, ref) {
			return true
		}
	}
	return false
}

// AddSnapshot takes a snapshot named name of the template or VM at vmPath, which becomes its
// current snapshot.
func (s *Sim) AddSnapshot(t testing.TB, vmPath, name string) {
	t.Helper()
	must(t, s.CreateSnapshot(context.Background(), vmPath, name))
}

// CreateSnapshot is AddSnapshot for callers without a testing.TB (the benchmark).
func (s *Sim) CreateSnapshot(ctx context.Context, vmPath, name string) error {
	vm, err := s.finder().VirtualMachine(ctx, vmPath)
	if err != nil {
		return err
	}
	task, err := vm.CreateSnapshot(ctx, name, "", false, false)
	if err != nil {
		return err
	}
	return task.Wait(ctx)
}

// CloneDelays makes each clone take its kind's time before vcsim carries it out (vcsim clones
// every kind at once, or all after one TaskDelay): a full clone copies the template's disks, a
// linked one only makes delta disks. It works on the client's side of the wire, per call, so clones
// overlap as they do in vCenter; use Wrap as (part of) the adapter's Wrapper.
type CloneDelays struct{ Full, Linked time.Duration }

// Wrap delays the clone calls through rt.
func (d CloneDelays) Wrap(rt soap.RoundTripper) soap.RoundTripper {
	return cloneDelayRT{d: d, next: rt}
}

type cloneDelayRT struct {
	d    CloneDelays
	next soap.RoundTripper
}

func (r cloneDelayRT) RoundTrip(ctx context.Context, req, res soap.HasFault) error {
	if clone, ok := req.(*methods.CloneVM_TaskBody); ok {
		wait := r.d.Full
		if clone.Req.Spec.Location.DiskMoveType == string(types.VirtualMachineRelocateDiskMoveOptionsCreateNewChildDiskBacking) {
			wait = r.d.Linked
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return r.next.RoundTrip(ctx, req, res)
}
