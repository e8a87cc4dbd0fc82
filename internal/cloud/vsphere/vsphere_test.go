package vsphere_test

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	domain "github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

func login(t *testing.T, sim *vsimtest.Sim, wrap vsphere.Wrapper) *vsphere.Client {
	t.Helper()
	if wrap == nil {
		wrap = sim.Wrap
	} else {
		wrap = vsimtest.Chain(wrap, sim.Wrap)
	}
	c, err := vsphere.Login(context.Background(), sim.Credentials(), wrap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Logout(context.Background()) })
	return c
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestFolderCloneListPowerReconfigureDestroy(t *testing.T) {
	sim := vsimtest.Start(t)
	sim.AddTemplate(t, "tmpl")
	counter := &vsimtest.Counter{}
	c := login(t, sim, counter.Wrap)
	ctx := context.Background()

	p, err := c.FolderPath(ctx, vsphere.Placement{}, "team-web")
	must(t, err)
	if p != "/DC0/vm/team-web" {
		t.Fatalf("FolderPath = %q", p)
	}
	if p, _ := c.FolderPath(ctx, vsphere.Placement{Datacenter: "DC0", Folder: "teams/"}, "x"); p != "/DC0/vm/teams/x" {
		t.Errorf("relative FolderPath = %q", p)
	}
	if p, _ := c.FolderPath(ctx, vsphere.Placement{Folder: "/DC0/vm/abs/"}, "x"); p != "/DC0/vm/abs/x" {
		t.Errorf("absolute FolderPath = %q", p)
	}
	if _, err := c.Folder(ctx, p, false); !errors.Is(err, vsphere.ErrNotFound) {
		t.Fatalf("Folder of a missing folder without create: %v", err)
	}
	f, err := c.Folder(ctx, p, true)
	must(t, err)
	if !f.Created || f.ID == "" {
		t.Fatalf("Folder = %+v, want created", f)
	}
	again, err := c.Folder(ctx, p, true)
	must(t, err)
	if again.Created || again.ID != f.ID {
		t.Fatalf("second Folder = %+v, want the same, not created", again)
	}

	src, err := c.Source(ctx, vsphere.Placement{}, vsphere.Template{Path: "tmpl"})
	must(t, err)
	marks := map[string]string{domain.KeyGroup: "team/web", domain.KeyTemplate: "tmpl"}
	for _, name := range []string{"web-0", "web-1"} {
		_, err := c.Clone(ctx, src, f, vsphere.CloneSpec{Name: name, CPU: 2, MemoryMB: 3072, ExtraConfig: marks})
		must(t, err)
	}

	counter.Reset()
	l, err := c.List(ctx, f)
	must(t, err)
	if n := counter.Total(); n != 1 {
		t.Errorf("List made %d calls, want 1: %v", n, counter.Calls())
	}
	if len(l.VMs) != 2 || l.Others != 0 {
		t.Fatalf("listing = %+v", l)
	}
	for _, vm := range l.VMs {
		if vm.PowerState != domain.PoweredOn || vm.CPU != 2 || vm.MemoryMB != 3072 || vm.Group != "team/web" || vm.Template != "tmpl" || vm.ID == "" {
			t.Errorf("cloned VM = %+v", vm)
		}
	}
	id := l.VMs[0].ID

	must(t, c.PowerOff(ctx, id))
	must(t, c.PowerOff(ctx, id)) // already off
	must(t, c.Reconfigure(ctx, id, 4, 8192, nil))
	must(t, c.PowerOn(ctx, id))
	must(t, c.PowerOn(ctx, id)) // already on
	got := sim.VMs(t, p)[l.VMs[0].Name]
	if got.CPU != 4 || got.MemoryMB != 8192 || got.PowerState != types.VirtualMachinePowerStatePoweredOn {
		t.Errorf("after reconfigure: %+v", got)
	}

	must(t, c.PowerOff(ctx, id))
	must(t, c.Destroy(ctx, id))
	must(t, c.Destroy(ctx, id)) // already gone
	must(t, c.PowerOff(ctx, id))
	if vms := sim.VMs(t, p); len(vms) != 1 {
		t.Errorf("VMs after destroy = %v", vms)
	}

	must(t, c.PowerOff(ctx, l.VMs[1].ID))
	must(t, c.Destroy(ctx, l.VMs[1].ID))
	must(t, c.DestroyFolder(ctx, f))
	must(t, c.DestroyFolder(ctx, f)) // already gone
	if sim.Exists(t, p) {
		t.Error("folder still exists")
	}
	if _, err := c.List(ctx, f); !errors.Is(err, vsphere.ErrNotFound) {
		t.Errorf("List of a destroyed folder: %v", err)
	}
}

func TestListSortsOutWhatIsNotOurs(t *testing.T) {
	sim := vsimtest.Start(t)
	c := login(t, sim, nil)
	ctx := context.Background()
	f, err := c.Folder(ctx, "/DC0/vm/ns-mixed", true)
	must(t, err)
	sim.AddVM(t, f.Path, "hand-made")
	_, err = c.Folder(ctx, f.Path+"/sub", true)
	must(t, err)
	sim.AddTemplate(t, "tmpl")
	l, err := c.List(ctx, f)
	must(t, err)
	if len(l.VMs) != 1 || l.VMs[0].Name != "hand-made" || l.VMs[0].Group != "" || l.Others != 1 {
		t.Errorf("listing = %+v", l)
	}
}

func TestPlacementAndTemplateNotFound(t *testing.T) {
	sim := vsimtest.Start(t)
	sim.AddTemplate(t, "tmpl")
	c := login(t, sim, nil)
	ctx := context.Background()

	_, err := c.Source(ctx, vsphere.Placement{}, vsphere.Template{Path: "missing"})
	if !vsphere.IsTemplateNotFound(err) || !strings.Contains(err.Error(), `template "missing" not found`) {
		t.Errorf("missing template: %v", err)
	}
	for _, tc := range []struct {
		p    vsphere.Placement
		kind string
	}{
		{vsphere.Placement{Datacenter: "DC9"}, "datacenter"},
		{vsphere.Placement{ResourcePool: "nope"}, "resource pool"},
		{vsphere.Placement{Datastore: "nope"}, "datastore"},
		{vsphere.Placement{Network: "nope"}, "network"},
	} {
		var nf *vsphere.NotFoundError
		if _, err := c.Source(ctx, tc.p, vsphere.Template{Path: "tmpl"}); !errors.As(err, &nf) || nf.Kind != tc.kind {
			t.Errorf("Source(%+v) = %v, want a missing %s", tc.p, err, tc.kind)
		}
	}
	var nf *vsphere.NotFoundError
	if _, err := c.Folder(ctx, "/DC0/vm/no-parent/group", true); !errors.As(err, &nf) || nf.Name != "/DC0/vm/no-parent" {
		t.Errorf("folder under a missing parent: %v", err)
	}

	// Items that exist but cannot be used as given.
	var inv *vsphere.InvalidError
	if _, err := c.Folder(ctx, "/DC0/vm/tmpl", true); !errors.As(err, &inv) || inv.Kind != "folder" {
		t.Errorf("a template at the folder's path: %v", err)
	}
	_, err = c.Folder(ctx, "/DC0/vm/sub", true)
	must(t, err)
	sim.AddVM(t, "/DC0/vm", "dup")
	sim.AddVM(t, "/DC0/vm/sub", "dup")
	if _, err := c.Source(ctx, vsphere.Placement{}, vsphere.Template{Path: "dup"}); !errors.As(err, &inv) || inv.Kind != "template" ||
		!strings.Contains(err.Error(), "matches several") {
		t.Errorf("a template name matching two VMs: %v", err)
	}

	// Explicit placement: pool, datastore and network are applied to the clone.
	src, err := c.Source(ctx, vsphere.Placement{Datacenter: "DC0", ResourcePool: "DC0_C0/Resources", Datastore: "LocalDS_0", Network: "DC0_DVPG0"}, vsphere.Template{Path: "/DC0/vm/tmpl"})
	must(t, err)
	f, err := c.Folder(ctx, "/DC0/vm/placed", true)
	must(t, err)
	id, err := c.Clone(ctx, src, f, vsphere.CloneSpec{Name: "placed-0", CPU: 1, MemoryMB: 1024})
	must(t, err)
	vm, err := find.NewFinder(sim.Admin.Client).VirtualMachine(ctx, "/DC0/vm/placed/placed-0")
	must(t, err)
	if vm.Reference().Value != id {
		t.Errorf("clone id %s, found %s", id, vm.Reference().Value)
	}
	devices, err := vm.Device(ctx)
	must(t, err)
	nics := devices.SelectByType((*types.VirtualEthernetCard)(nil))
	if len(nics) == 0 {
		t.Fatal("clone has no network adapter")
	}
	if _, ok := nics[0].GetVirtualDevice().Backing.(*types.VirtualEthernetCardDistributedVirtualPortBackingInfo); !ok {
		t.Errorf("first NIC backing = %T, want the port group's", nics[0].GetVirtualDevice().Backing)
	}
}

func TestSessionIsLoggedInAgainWhenItEnds(t *testing.T) {
	sim := vsimtest.Start(t)
	counter := &vsimtest.Counter{}
	conn := &vsphere.Connector{Wrap: vsimtest.Chain(counter.Wrap, sim.Wrap)}
	t.Cleanup(conn.Close)
	ctx := context.Background()
	c, err := conn.Get(ctx, sim.Credentials())
	must(t, err)
	f, err := c.Folder(ctx, "/DC0/vm/relogin", true)
	must(t, err)
	again, err := conn.Get(ctx, sim.Credentials())
	must(t, err)
	if again != c || counter.Calls()["Login"] != 1 {
		t.Fatalf("the session was not reused: %v", counter.Calls())
	}

	if n := sim.EndSessions(t); n == 0 {
		t.Fatal("no session to end")
	}
	// A property collector answer without a session is not a fault: it must still log in again.
	if _, err := c.List(ctx, f); err != nil {
		t.Fatalf("List after the session ended: %v", err)
	}
	if got := counter.Calls()["Login"]; got != 2 {
		t.Errorf("logins = %d, want 2", got)
	}
	sim.EndSessions(t)
	if _, err := c.Folder(ctx, f.Path, false); err != nil {
		t.Fatalf("Folder after the session ended: %v", err)
	}
	if got := counter.Calls()["Login"]; got != 3 {
		t.Errorf("logins = %d, want 3", got)
	}

	// New credentials (a rotated Secret) open a new session.
	creds := sim.Credentials()
	creds.Password = "wrong-" + creds.Password
	if _, err := conn.Get(ctx, creds); err == nil {
		t.Error("login with a wrong password succeeded")
	} else if strings.Contains(err.Error(), creds.Password) {
		t.Errorf("the error shows the password: %v", err)
	}
}

func TestLoginErrorsHideCredentials(t *testing.T) {
	sim := vsimtest.Start(t)
	ctx := context.Background()

	creds := sim.Credentials()
	creds.Insecure = false
	if _, err := vsphere.Login(ctx, creds, nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("self-signed certificate without insecure: %v", err)
	}

	creds = sim.Credentials()
	creds.Password = "not-" + creds.Password
	_, err := vsphere.Login(ctx, creds, nil)
	if err == nil {
		t.Fatal("wrong password accepted")
	}
	if strings.Contains(err.Error(), creds.Password) || strings.Contains(creds.String(), creds.Password) {
		t.Errorf("password shown: %v / %s", err, creds)
	}

	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	creds.Server = &url.URL{Scheme: "https", Host: "127.0.0.1:1", Path: "/sdk"}
	if _, err := vsphere.Login(ctx, creds, nil); err == nil {
		t.Error("login to a closed port succeeded")
	}
}

// TestLoginWithCABundle: a CA bundle verifies vCenter's self-signed certificate instead of
// skipping the check; a bundle without a certificate is refused before any connection.
func TestLoginWithCABundle(t *testing.T) {
	sim := vsimtest.Start(t)
	ctx := context.Background()
	creds := sim.Credentials()
	creds.Insecure = false
	creds.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: sim.Server.Certificate().Raw})
	c, err := vsphere.Login(ctx, creds, sim.Wrap)
	if err != nil {
		t.Fatalf("login verified by the CA bundle: %v", err)
	}
	_ = c.Logout(ctx)

	creds.CAPEM = []byte("not a certificate")
	if _, err := vsphere.Login(ctx, creds, nil); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a bundle without certificates: %v", err)
	}
}

// TestLinkedClones: a linked clone's disks are children of a snapshot of the template (the current
// one, or one by name), which vCenter (the Sim's part of it) checks; a template without the
// snapshot is an InvalidError that says what a person does.
func TestLinkedClones(t *testing.T) {
	sim := vsimtest.Start(t)
	sim.AddTemplate(t, "tmpl")
	sim.AddTemplate(t, "bare")
	sim.AddSnapshot(t, "tmpl", "base")
	sim.AddSnapshot(t, "tmpl", "patched")
	c := login(t, sim, nil)
	ctx := context.Background()
	f, err := c.Folder(ctx, "/DC0/vm/linked", true)
	must(t, err)
	fullBefore, linkedBefore := sim.Clones()

	for i, tmpl := range []vsphere.Template{
		{Path: "tmpl", Linked: true},
		{Path: "tmpl", Linked: true, Snapshot: "base"},
		{Path: "tmpl"},
	} {
		src, err := c.Source(ctx, vsphere.Placement{}, tmpl)
		must(t, err)
		if src.Linked() != tmpl.Linked {
			t.Errorf("%+v: source linked %v", tmpl, src.Linked())
		}
		_, err = c.Clone(ctx, src, f, vsphere.CloneSpec{Name: fmt.Sprintf("vm-%d", i), CPU: 1, MemoryMB: 1024})
		must(t, err)
	}
	if full, linked := sim.Clones(); full-fullBefore != 1 || linked-linkedBefore != 2 {
		t.Errorf("clones: %d full, %d linked; want 1 and 2", full-fullBefore, linked-linkedBefore)
	}

	for _, tc := range []struct {
		tmpl vsphere.Template
		want string
	}{
		{vsphere.Template{Path: "bare", Linked: true}, `template "bare": has no snapshot: a linked clone (cloneMode: Linked) is made from a snapshot of its template; take one, or clone in full (cloneMode: Full)`},
		{vsphere.Template{Path: "tmpl", Linked: true, Snapshot: "gone"}, `template "tmpl": has no snapshot named "gone" (it has "base", "patched")`},
	} {
		_, err := c.Source(ctx, vsphere.Placement{}, tc.tmpl)
		var inv *vsphere.InvalidError
		if !errors.As(err, &inv) || err.Error() != tc.want {
			t.Errorf("Source(%+v) = %v, want an InvalidError %q", tc.tmpl, err, tc.want)
		}
	}
}

// TestAntiAffinityRule: the placement's cluster, its rule made, read, replaced and removed (twice:
// a rule gone is no error); the Sim's DRS places a rule's VMs on separate hosts at power-on and
// refuses, for a mandatory rule, the one no host is left for (RuleViolation); a rule of the name
// that is not a VM-VM anti-affinity rule is refused.
func TestAntiAffinityRule(t *testing.T) {
	sim := vsimtest.Start(t)
	sim.AddTemplate(t, "tmpl")
	c := login(t, sim, nil)
	ctx := context.Background()
	cl, err := c.Cluster(ctx, vsphere.Placement{})
	must(t, err)
	if cl.Name != vsimtest.Cluster || cl.Standalone {
		t.Fatalf("cluster = %+v, want %s", cl, vsimtest.Cluster)
	}
	state, err := c.Affinity(ctx, cl, "apart")
	must(t, err)
	if !state.DRS || state.Rule != nil {
		t.Fatalf("affinity = %+v, want DRS on and no rule", state)
	}

	f, err := c.Folder(ctx, "/DC0/vm/apart", true)
	must(t, err)
	src, err := c.Source(ctx, vsphere.Placement{}, vsphere.Template{Path: "tmpl"})
	must(t, err)
	hosts := sim.ClusterHosts(t)
	var ids []string
	for i := range hosts + 1 {
		id, err := c.Clone(ctx, src, f, vsphere.CloneSpec{Name: fmt.Sprintf("vm-%d", i), CPU: 1, MemoryMB: 1024, PoweredOff: true})
		must(t, err)
		ids = append(ids, id)
	}
	slices.Sort(ids)
	must(t, c.PutRule(ctx, cl, vsphere.Rule{Name: "apart", Mandatory: true, VMs: ids}))
	state, err = c.Affinity(ctx, cl, "apart")
	must(t, err)
	if r := state.Rule; r == nil || r.Key == 0 || !r.Mandatory || !r.Enabled || !slices.Equal(r.VMs, ids) {
		t.Fatalf("rule = %+v, want mandatory, enabled, holding %v", r, ids)
	}
	refused := 0
	for _, id := range ids {
		if err := c.PowerOn(ctx, id); err != nil {
			if !vsphere.Unplaceable(err) {
				t.Fatalf("power-on of %s: %v, want RuleViolation", id, err)
			}
			refused++
		}
	}
	placed, vms := sim.Hosts(t, "/DC0/vm/apart"), sim.VMs(t, "/DC0/vm/apart")
	used := map[string]bool{}
	for name, h := range placed {
		if vms[name].PowerState == types.VirtualMachinePowerStatePoweredOn {
			used[h] = true
		}
	}
	if refused != 1 || len(used) != hosts {
		t.Errorf("%d power-ons refused, hosts %v; want 1 refused and %d hosts used", refused, placed, hosts)
	}

	// Replaced as optional, the last VM runs beside another.
	must(t, c.PutRule(ctx, cl, vsphere.Rule{Key: state.Rule.Key, Name: "apart", VMs: ids}))
	for _, id := range ids {
		must(t, c.PowerOn(ctx, id))
	}
	must(t, c.RemoveRule(ctx, cl, state.Rule.Key))
	must(t, c.RemoveRule(ctx, cl, state.Rule.Key))
	if state, err = c.Affinity(ctx, cl, "apart"); err != nil || state.Rule != nil {
		t.Errorf("after removal: %+v, %v", state.Rule, err)
	}

	spec := &types.ClusterConfigSpecEx{RulesSpec: []types.ClusterRuleSpec{{
		ArrayUpdateSpec: types.ArrayUpdateSpec{Operation: types.ArrayUpdateOperationAdd},
		Info:            &types.ClusterAffinityRuleSpec{ClusterRuleInfo: types.ClusterRuleInfo{Name: "together", Enabled: types.NewBool(true)}, Vm: []types.ManagedObjectReference{{Type: "VirtualMachine", Value: ids[0]}, {Type: "VirtualMachine", Value: ids[1]}}},
	}}}
	ccr, err := find.NewFinder(sim.Admin.Client).ClusterComputeResource(ctx, "/DC0/host/"+vsimtest.Cluster)
	must(t, err)
	task, err := ccr.Reconfigure(ctx, spec, true)
	must(t, err)
	must(t, task.Wait(ctx))
	var inv *vsphere.InvalidError
	if _, err := c.Affinity(ctx, cl, "together"); !errors.As(err, &inv) || !strings.Contains(err.Error(), "not a VM-VM anti-affinity rule") {
		t.Errorf("a rule of another kind: %v, want an InvalidError", err)
	}
}

// TestDataDisks: a clone gets the data disks beside the template's, on the template's SCSI
// controller at free units, recorded in the listing's disks mark; Reconfigure grows one in place.
func TestDataDisks(t *testing.T) {
	sim := vsimtest.Start(t)
	sim.AddTemplate(t, "tmpl")
	c := login(t, sim, nil)
	ctx := context.Background()
	f, err := c.Folder(ctx, "/DC0/vm/disks", true)
	must(t, err)
	base := len(sim.Disks(t, "tmpl"))
	src, err := c.Source(ctx, vsphere.Placement{}, vsphere.Template{Path: "tmpl", Disks: []domain.Disk{{Name: "data", SizeGiB: 10}, {Name: "logs", SizeGiB: 2, Datastore: "LocalDS_0"}}})
	must(t, err)
	placed := src.Disks()
	if len(placed) != 2 || placed[0].Controller == 0 || placed[0].Unit == placed[1].Unit || placed[0].Unit == 7 {
		t.Fatalf("placed disks %+v", placed)
	}
	id, err := c.Clone(ctx, src, f, vsphere.CloneSpec{Name: "vm", CPU: 1, MemoryMB: 1024, ExtraConfig: map[string]string{domain.KeyDisks: domain.DisksMark(placed)}})
	must(t, err)
	got := sim.Disks(t, "/DC0/vm/disks/vm")
	if len(got) != base+2 || got[base] != 10 || got[base+1] != 2 {
		t.Fatalf("disks %v, want the template's %d and 10, 2 GiB", got, base)
	}
	l, err := c.List(ctx, f)
	must(t, err)
	if len(l.VMs) != 1 || fmt.Sprint(l.VMs[0].Disks) != fmt.Sprint(placed) {
		t.Fatalf("listed disks %+v, want %+v", l.VMs[0].Disks, placed)
	}

	grown := slices.Clone(placed)
	grown[0].SizeGiB = 25
	must(t, c.PowerOff(ctx, id))
	must(t, c.Reconfigure(ctx, id, 1, 1024, grown))
	if got := sim.Disks(t, "/DC0/vm/disks/vm"); got[base] != 25 || got[base+1] != 2 {
		t.Errorf("disks after growing data: %v", got)
	}
	l, err = c.List(ctx, f)
	must(t, err)
	if l.VMs[0].Disks[0].SizeGiB != 25 {
		t.Errorf("the mark after growing: %+v", l.VMs[0].Disks)
	}
	gone := []domain.Disk{{Name: "data", SizeGiB: 30, Controller: placed[0].Controller, Unit: 15}}
	if err := c.Reconfigure(ctx, id, 1, 1024, gone); err == nil || !strings.Contains(err.Error(), `data disk "data" is not on the VM`) {
		t.Errorf("growing a disk not there: %v", err)
	}
}
