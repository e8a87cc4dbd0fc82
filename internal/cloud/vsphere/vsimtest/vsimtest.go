// Package vsimtest runs the govmomi vCenter simulator (vcsim) in process for tests and demos: a VPX
// model served over HTTPS with its own credentials, templates on demand, and helpers to look at
// and change the inventory behind the operator's back. Its wrapper plays the parts of vCenter
// vcsim lacks: linked clones' snapshots (clones.go), DRS's anti-affinity placement (drs.go); its
// guests play VMware Tools and cloud-init's static address (guests.go).
package vsimtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"net"
	"net/url"
	"path"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/property"
	"github.com/vmware/govmomi/session"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
)

// Inventory of the model.
const (
	Datacenter = "DC0"
	VMFolder   = "/DC0/vm"
	// SourceVM is the model VM templates are cloned from.
	SourceVM = "DC0_C0_RP0_VM0"
)

// Sim is a running simulator.
type Sim struct {
	Model    *simulator.Model
	Server   *simulator.Server
	URL      *url.URL // the SDK endpoint, without credentials
	User     string
	Password string
	// Admin is a session of its own for assertions and out-of-band changes.
	Admin *govmomi.Client
	// Guests plays the VMs' VMware Tools (Start runs it; New leaves it to the caller).
	Guests *Guests

	taskMu sync.Mutex
	// folderMu: a CreateFolder or a task runs alone, no property read beside it (vcsim v0.56.0
	// writes the parent's childEntity while a RetrievePropertiesEx may copy it: a race the
	// detector reports).
	folderMu  sync.RWMutex
	doneTasks map[types.ManagedObjectReference]bool
	clones    clones
	unwrapped *vim25.Client
}

// Start runs a VPX simulator until the test ends. Standalone hosts are off (Host = 0) so the
// cluster's pool is the only default resource pool; the password is random, so tests can check
// it never leaks.
func Start(t testing.TB) *Sim {
	t.Helper()
	return StartOn(t, "")
}

// StartOn is Start listening on host (an address of this machine; empty: loopback), for clients
// that reach it from elsewhere (a manager in a Pod of a real node).
func StartOn(t testing.TB, host string) *Sim {
	t.Helper()
	s, err := NewOn(context.Background(), host)
	if err != nil {
		t.Fatalf("starting vcsim: %v", err)
	}
	t.Cleanup(s.Stop)
	if s.Guests, err = s.StartGuests(context.Background()); err != nil {
		t.Fatalf("starting vcsim's guests: %v", err)
	}
	return s
}

// New runs a simulator until Stop; for callers without a testing.TB (a demo command).
func New(ctx context.Context) (*Sim, error) { return NewOn(ctx, "") }

// NewOn is New listening on host (empty: loopback).
func NewOn(ctx context.Context, host string) (*Sim, error) {
	model := simulator.VPX()
	model.Host = 0
	if err := model.Create(); err != nil {
		return nil, err
	}
	pw := make([]byte, 12)
	_, _ = rand.Read(pw)
	s := &Sim{Model: model, User: "qm-operator@vsphere.local", Password: "pw-" + hex.EncodeToString(pw)}
	model.Service.Listen = &url.URL{User: url.UserPassword(s.User, s.Password)}
	if host != "" {
		model.Service.Listen.Host = net.JoinHostPort(host, "0")
	}
	model.Service.TLS = new(tls.Config) // HTTPS with a self-signed certificate, like vCenter
	s.Server = model.Service.NewServer()
	u := *s.Server.URL
	u.User = nil
	s.URL = &u
	sc := soap.NewClient(s.URL, true)
	vc, err := vim25.NewClient(ctx, sc)
	if err != nil {
		s.Stop()
		return nil, err
	}
	vc.RoundTripper = s.Wrap(sc)
	s.Admin = &govmomi.Client{Client: vc, SessionManager: session.NewManager(vc)}
	if err := s.Admin.Login(ctx, url.UserPassword(s.User, s.Password)); err != nil {
		s.Stop()
		return nil, err
	}
	// The Admin session without the wrapper, for the wrapper's own reads while it holds the lock.
	s.unwrapped = &vim25.Client{Client: sc, ServiceContent: vc.ServiceContent, RoundTripper: sc}
	return s, nil
}

// Wrap must wrap the transport of every client of the simulator (the operator's adapter takes it
// as its Wrapper): it runs the simulator's tasks one at a time. vcsim v0.56.0 races on a shared
// datastore when tasks run concurrently (a VM's DestroyTask updates the datastore while another
// task copies it), which the race detector reports; the operator's own concurrency is not at fault.
func (s *Sim) Wrap(rt soap.RoundTripper) soap.RoundTripper { return serialRT{s: s, next: rt} }

type serialRT struct {
	s    *Sim
	next soap.RoundTripper
}

func (r serialRT) RoundTrip(ctx context.Context, req, res soap.HasFault) error {
	name := reflect.TypeOf(req).Elem().Name()
	switch {
	case name == "CreateFolderBody", strings.HasSuffix(name, "_TaskBody"):
		// A task (a destroy removing a VM or folder from its parent, a clone adding one) writes
		// folders' childEntity in its own goroutine while it runs, as CreateFolder does in the
		// call: no property read beside it (the race detector saw a Folder.Destroy_Task beside a
		// RetrievePropertiesEx in CI).
		r.s.folderMu.Lock()
		defer r.s.folderMu.Unlock()
	case name == "WaitForUpdatesExBody", name == "WaitForUpdatesBody":
		// Long polls: a folder made meanwhile must not wait for them.
	default:
		r.s.folderMu.RLock()
		defer r.s.folderMu.RUnlock()
	}
	if !strings.HasSuffix(name, "_TaskBody") {
		return r.next.RoundTrip(ctx, req, res)
	}
	r.s.taskMu.Lock()
	defer r.s.taskMu.Unlock()
	var check error
	switch body := req.(type) {
	case *methods.CloneVM_TaskBody:
		check = r.s.checkClone(ctx, body)
	case *methods.PowerOnVM_TaskBody:
		check = r.s.place(ctx, body.Req.This)
	}
	if check != nil {
		return check
	}
	err := r.next.RoundTrip(ctx, req, res)
	r.s.waitTasks() // including tasks the task started, such as a destroy's file deletion
	return err
}

// waitTasks waits until no task of the simulator runs. Callers hold taskMu.
func (s *Sim) waitTasks() {
	if s.doneTasks == nil {
		s.doneTasks = map[types.ManagedObjectReference]bool{}
	}
	// A task may start others while it runs (a destroy starts a file deletion), so look again
	// until a pass finds nothing new.
	for waited := true; waited; {
		waited = false
		for _, obj := range s.Model.Map().AllReference("Task") {
			t, ok := obj.(*simulator.Task)
			if !ok || s.doneTasks[t.Self] {
				continue
			}
			t.Wait()
			s.doneTasks[t.Self] = true
			waited = true
		}
	}
}

// Chain applies wrappers, innermost (closest to the wire) first.
func Chain(wrappers ...func(soap.RoundTripper) soap.RoundTripper) func(soap.RoundTripper) soap.RoundTripper {
	return func(rt soap.RoundTripper) soap.RoundTripper {
		for _, w := range wrappers {
			rt = w(rt)
		}
		return rt
	}
}

// Stop shuts the simulator down.
func (s *Sim) Stop() {
	if s.Guests != nil {
		s.Guests.Stop()
	}
	if s.Admin != nil {
		_ = s.Admin.Logout(context.Background())
	}
	s.Server.Close()
	s.Model.Remove()
}

// Host is the VC_HOST value for the simulator (host:port).
func (s *Sim) Host() string { return s.URL.Host }

// Credentials for the operator's adapter (the certificate is self-signed: insecure).
func (s *Sim) Credentials() vsphere.Credentials {
	return vsphere.Credentials{Server: s.URL, User: s.User, Password: s.Password, Insecure: true}
}

func (s *Sim) finder() *find.Finder {
	f := find.NewFinder(s.Admin.Client)
	dc, err := f.Datacenter(context.Background(), Datacenter)
	if err == nil {
		f.SetDatacenter(dc)
	}
	return f
}

// AddTemplate makes a template called name in the datacenter's VM folder (a powered-off clone of
// the model's first VM, marked as template) and returns its inventory path.
func (s *Sim) AddTemplate(t testing.TB, name string) string {
	t.Helper()
	p, err := s.CreateTemplate(context.Background(), name)
	must(t, err)
	return p
}

// CreateTemplate is AddTemplate for callers without a testing.TB (the development vCenter command).
func (s *Sim) CreateTemplate(ctx context.Context, name string) (string, error) {
	f := s.finder()
	vm, err := f.VirtualMachine(ctx, SourceVM)
	if err != nil {
		return "", err
	}
	folder, err := f.Folder(ctx, VMFolder)
	if err != nil {
		return "", err
	}
	task, err := vm.Clone(ctx, folder, name, types.VirtualMachineCloneSpec{Template: true})
	if err != nil {
		return "", err
	}
	if err := task.Wait(ctx); err != nil {
		return "", err
	}
	return VMFolder + "/" + name, nil
}

// Destroy destroys the VM or template at an inventory path (out of band). An operator repairing
// drift may power the VM on again between the power-off and the destroy, so it tries a few times.
func (s *Sim) Destroy(t testing.TB, vmPath string) {
	t.Helper()
	ctx := context.Background()
	vm, err := s.finder().VirtualMachine(ctx, vmPath)
	must(t, err)
	for range 10 {
		if st, _ := vm.PowerState(ctx); st != types.VirtualMachinePowerStatePoweredOff {
			if task, err := vm.PowerOff(ctx); err == nil {
				_ = task.Wait(ctx)
			}
		}
		task, err := vm.Destroy(ctx)
		must(t, err)
		if err = task.Wait(ctx); err == nil || !fault.Is(err, &types.InvalidPowerState{}) {
			must(t, err)
			return
		}
	}
	t.Fatalf("could not destroy %s: it keeps being powered on", vmPath)
}

// PowerOff powers the VM at an inventory path off (out of band).
func (s *Sim) PowerOff(t testing.TB, vmPath string) {
	t.Helper()
	ctx := context.Background()
	vm, err := s.finder().VirtualMachine(ctx, vmPath)
	must(t, err)
	task, err := vm.PowerOff(ctx)
	must(t, err)
	must(t, task.Wait(ctx))
}

// PowerOn powers the VM at an inventory path on (out of band).
func (s *Sim) PowerOn(t testing.TB, vmPath string) {
	t.Helper()
	ctx := context.Background()
	vm, err := s.finder().VirtualMachine(ctx, vmPath)
	must(t, err)
	task, err := vm.PowerOn(ctx)
	must(t, err)
	must(t, task.Wait(ctx))
}

// AddVM puts a VM that the operator did not create into a folder (a clone of the model's first VM,
// without the operator's marks).
func (s *Sim) AddVM(t testing.TB, folderPath, name string) {
	t.Helper()
	ctx := context.Background()
	f := s.finder()
	vm, err := f.VirtualMachine(ctx, SourceVM)
	must(t, err)
	folder, err := f.Folder(ctx, folderPath)
	must(t, err)
	task, err := vm.Clone(ctx, folder, name, types.VirtualMachineCloneSpec{})
	must(t, err)
	must(t, task.Wait(ctx))
}

// VM is a VM as the simulator holds it.
type VM struct {
	Name        string
	PowerState  types.VirtualMachinePowerState
	CPU         int32
	MemoryMB    int32
	Template    bool
	ExtraConfig map[string]string
}

// Disks returns the sizes in GiB of the VM's disks at an inventory path, by controller and unit.
func (s *Sim) Disks(t testing.TB, vmPath string) []int64 {
	t.Helper()
	out, err := s.DisksOf(context.Background(), vmPath)
	must(t, err)
	return out
}

// DisksOf is Disks for a VM that may be gone (replaced) meanwhile: it returns the error.
func (s *Sim) DisksOf(ctx context.Context, vmPath string) ([]int64, error) {
	vm, err := s.finder().VirtualMachine(ctx, vmPath)
	if err != nil {
		return nil, err
	}
	devices, err := vm.Device(ctx)
	if err != nil {
		return nil, err
	}
	var disks []*types.VirtualDisk
	for _, d := range devices.SelectByType((*types.VirtualDisk)(nil)) {
		disks = append(disks, d.(*types.VirtualDisk))
	}
	unit := func(d *types.VirtualDisk) int32 {
		if d.UnitNumber == nil {
			return -1
		}
		return *d.UnitNumber
	}
	slices.SortFunc(disks, func(a, b *types.VirtualDisk) int {
		return cmp.Or(cmp.Compare(a.ControllerKey, b.ControllerKey), cmp.Compare(unit(a), unit(b)))
	})
	var out []int64
	for _, d := range disks {
		out = append(out, d.CapacityInKB>>20)
	}
	return out, nil
}

// Exists reports whether an inventory path names something.
func (s *Sim) Exists(t testing.TB, p string) bool {
	t.Helper()
	ref, err := object.NewSearchIndex(s.Admin.Client).FindByInventoryPath(context.Background(), p)
	must(t, err)
	return ref != nil
}

// VMs lists the VMs directly in a folder by name; nil when the folder does not exist.
func (s *Sim) VMs(t testing.TB, folderPath string) map[string]VM {
	t.Helper()
	vms, err := s.ListVMs(context.Background(), folderPath)
	must(t, err)
	return vms
}

// ListVMs is VMs for goroutines other than the test's (it returns errors instead of failing).
func (s *Sim) ListVMs(ctx context.Context, folderPath string) (map[string]VM, error) {
	ref, err := object.NewSearchIndex(s.Admin.Client).FindByInventoryPath(ctx, folderPath)
	if err != nil || ref == nil {
		return nil, err
	}
	children, err := object.NewFolder(s.Admin.Client, ref.Reference()).Children(ctx)
	if err != nil {
		return nil, err
	}
	var refs []types.ManagedObjectReference
	for _, c := range children {
		if c.Reference().Type == "VirtualMachine" {
			refs = append(refs, c.Reference())
		}
	}
	out := map[string]VM{}
	if len(refs) == 0 {
		return out, nil
	}
	var mos []mo.VirtualMachine
	if err := property.DefaultCollector(s.Admin.Client).Retrieve(ctx, refs, []string{"name", "runtime.powerState", "config"}, &mos); err != nil {
		return nil, err
	}
	for _, m := range mos {
		vm := VM{Name: m.Name, PowerState: m.Runtime.PowerState, ExtraConfig: map[string]string{}}
		if m.Config != nil {
			vm.CPU, vm.MemoryMB, vm.Template = m.Config.Hardware.NumCPU, m.Config.Hardware.MemoryMB, m.Config.Template
			for _, o := range m.Config.ExtraConfig {
				if ov := o.GetOptionValue(); strings.HasPrefix(ov.Key, "quartermaster.") || strings.HasPrefix(ov.Key, "guestinfo.") {
					vm.ExtraConfig[ov.Key], _ = ov.Value.(string)
				}
			}
		}
		out[m.Name] = vm
	}
	return out, nil
}

// Contents lists the names of everything directly in a folder (VMs, templates, folders), sorted;
// unlike VMs, a name held twice shows twice. Nil when the folder does not exist.
func (s *Sim) Contents(t testing.TB, folderPath string) []string {
	t.Helper()
	ctx := context.Background()
	ref, err := object.NewSearchIndex(s.Admin.Client).FindByInventoryPath(ctx, folderPath)
	must(t, err)
	if ref == nil {
		return nil
	}
	children, err := object.NewFolder(s.Admin.Client, ref.Reference()).Children(ctx)
	must(t, err)
	names := []string{}
	for _, c := range children {
		name, err := object.NewCommon(s.Admin.Client, c.Reference()).ObjectName(ctx)
		must(t, err)
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// EndSessions ends every session but the admin's, as vCenter does when sessions expire.
func (s *Sim) EndSessions(t testing.TB) int {
	t.Helper()
	ctx := context.Background()
	var sm mo.SessionManager
	must(t, s.Admin.RetrieveOne(ctx, *s.Admin.ServiceContent.SessionManager, []string{"sessionList", "currentSession"}, &sm))
	var keys []string
	for _, us := range sm.SessionList {
		if sm.CurrentSession == nil || us.Key != sm.CurrentSession.Key {
			keys = append(keys, us.Key)
		}
	}
	if len(keys) > 0 {
		must(t, s.Admin.SessionManager.TerminateSession(ctx, keys))
	}
	return len(keys)
}

// Counter counts SOAP calls by method; use Wrap as the adapter's Wrapper.
type Counter struct {
	mu    sync.Mutex
	calls map[string]int
}

// Wrap counts every call that goes through rt.
func (c *Counter) Wrap(rt soap.RoundTripper) soap.RoundTripper {
	return countingRT{c: c, next: rt}
}

type countingRT struct {
	c    *Counter
	next soap.RoundTripper
}

func (r countingRT) RoundTrip(ctx context.Context, req, res soap.HasFault) error {
	method := strings.TrimSuffix(reflect.TypeOf(req).Elem().Name(), "Body")
	r.c.mu.Lock()
	if r.c.calls == nil {
		r.c.calls = map[string]int{}
	}
	r.c.calls[method]++
	r.c.mu.Unlock()
	return r.next.RoundTrip(ctx, req, res)
}

// Calls returns the counts by method.
func (c *Counter) Calls() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.calls {
		out[k] = v
	}
	return out
}

// Total is the number of calls.
func (c *Counter) Total() int {
	n := 0
	for _, v := range c.Calls() {
		n += v
	}
	return n
}

// Reset forgets the counts.
func (c *Counter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = nil
}

// VMPath is the inventory path of a VM in a folder.
func VMPath(folderPath, name string) string { return path.Join(folderPath, name) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Latency delays every call through it by the given time, as a slow link to vCenter would (the
// round trip of both ways together); use Wrap as (part of) the adapter's Wrapper. It delays every
// SOAP call alike, the long polls of task waits included, as a real link does.
type Latency time.Duration

// Wrap delays every call through rt.
func (d Latency) Wrap(rt soap.RoundTripper) soap.RoundTripper {
	return latencyRT{d: time.Duration(d), next: rt}
}

type latencyRT struct {
	d    time.Duration
	next soap.RoundTripper
}

func (r latencyRT) RoundTrip(ctx context.Context, req, res soap.HasFault) error {
	t := time.NewTimer(r.d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	return r.next.RoundTrip(ctx, req, res)
}
