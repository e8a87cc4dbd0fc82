package vmgroups

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	govmomiobject "github.com/vmware/govmomi/object"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testAddressPool: each VM of a group with an address pool gets its own address, recorded in the
// status before the clone, written into its cloud-init network configuration for its adapter's MAC
// address (the Sim's guests apply it and report it, as cloud-init and VMware Tools would); an
// address a VM Quartermaster did not create reports is skipped with an Event; the pool running
// out stalls the group naming the VMs left without; an overlapping pool of another group never
// gets an address twice; a clone refused after its address was recorded, and a new manager, give
// the VM the same address; scaled in, the addresses are released.
func testAddressPool(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-addr")

	// A VM someone configured by hand with the pool's first address.
	f.sim.AddVM(t, "/DC0/vm", "squatter")
	f.sim.PowerOn(t, "/DC0/vm/squatter")
	testenv.Eventually(t, "the squatter's guest up", func() (bool, string) {
		vm := f.sim.VMs(t, "/DC0/vm")["squatter"]
		return vm.PowerState == "poweredOn", string(vm.PowerState)
	})
	f.sim.Guests.Report(t, "/DC0/vm/squatter", "10.90.0.10")
	testenv.Eventually(t, "the squatter reporting 10.90.0.10", func() (bool, string) {
		refs, err := govmomiobject.NewSearchIndex(f.sim.Admin.Client).FindAllByIp(ctx, nil, "10.90.0.10", true)
		return err == nil && len(refs) == 1, fmt.Sprint(refs, err)
	})

	pool := &computev1alpha1.AddressPool{Network: "10.90.0.0/24", Addresses: []string{"10.90.0.10-10.90.0.13"}, Gateway: "10.90.0.1", Nameservers: []string{"10.90.0.2"}}
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t-addr", Name: "net"},
		Spec:       computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "tmpl-a", Replicas: ptr.To[int32](3), AddressPool: pool},
	}
	must(t, f.c.Create(ctx, vg))
	got := f.waitRunning(t, "t-addr", "net", 3) // readiness GuestIP: each guest reports its address
	want := map[string]string{"net-0": "10.90.0.11", "net-1": "10.90.0.12", "net-2": "10.90.0.13"}
	checkAddresses(t, got, want)
	e := f.waitEvent(t, vg, "AddressInUse")
	if !strings.Contains(e.Note, "10.90.0.10") || !strings.Contains(e.Note, "squatter") {
		t.Errorf("AddressInUse note %q, want the address and the VM using it", e.Note)
	}
	// The guest's network configuration: its adapter's MAC, the address, gateway, name server.
	md := metadataOf(t, f, "/DC0/vm/t-addr-net/net-0")
	eth := md.Network.Ethernets["id0"]
	if eth.Match.MAC == "" || len(eth.Addresses) != 1 || eth.Addresses[0] != "10.90.0.11/24" || eth.DHCP4 ||
		len(eth.Routes) != 1 || eth.Routes[0].Via != "10.90.0.1" || len(eth.Nameservers.Addresses) != 1 || eth.Nameservers.Addresses[0] != "10.90.0.2" {
		t.Errorf("network configuration of net-0: %+v", md.Network)
	}

	// Another group whose pool overlaps gets what the first does not hold.
	other := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t-addr", Name: "side"},
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "tmpl-a", Replicas: ptr.To[int32](1),
			AddressPool: &computev1alpha1.AddressPool{Network: "10.90.0.0/24", Addresses: []string{"10.90.0.12-10.90.0.14"}}},
	}
	must(t, f.c.Create(ctx, other))
	checkAddresses(t, f.waitRunning(t, "t-addr", "side", 1), map[string]string{"side-0": "10.90.0.14"})

	// The pool runs out: the VM left without is named, and not cloned.
	f.update(t, "t-addr", "net", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](4) })
	f.waitStalled(t, "t-addr", "net", "AddressPoolExhausted", "no address left in spec.addressPool for net-3")
	if _, ok := f.sim.VMs(t, "/DC0/vm/t-addr-net")["net-3"]; ok {
		t.Error("net-3 cloned without an address")
	}

	// Scaled in: net-2's address is released; the other group takes it.
	f.update(t, "t-addr", "net", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](2) })
	checkAddresses(t, f.waitRunning(t, "t-addr", "net", 2), map[string]string{"net-0": "10.90.0.11", "net-1": "10.90.0.12"})
	f.update(t, "t-addr", "side", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](2) })
	checkAddresses(t, f.waitRunning(t, "t-addr", "side", 2), map[string]string{"side-0": "10.90.0.14", "side-1": "10.90.0.13"})

	// A clone refused after its address was recorded; the manager replaced meanwhile: the VM gets
	// the address recorded for it, and no other is taken.
	must(t, f.c.Delete(ctx, other))
	f.faults.Set(&vsimtest.Rule{Methods: []string{"CloneVM_Task"}, Fraction: 1})
	f.update(t, "t-addr", "net", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](3) })
	testenv.Eventually(t, "net-2's address recorded, its clone refused", func() (bool, string) {
		got := f.get(t, "t-addr", "net")
		return len(got.Status.Addresses) == 3 && f.faults.Injected() > 0, fmt.Sprintf("%+v, %d faults", got.Status.Addresses, f.faults.Injected())
	})
	recorded := f.get(t, "t-addr", "net").Status.Addresses[2]
	f.restart(t)
	f.faults.Set(nil)
	got = f.waitRunning(t, "t-addr", "net", 3)
	checkAddresses(t, got, map[string]string{"net-0": "10.90.0.11", "net-1": "10.90.0.12", recorded.VM: strings.TrimSuffix(recorded.Address, "/24")})

	// A pool the API server cannot judge (an address outside the network) stalls, naming it.
	bad := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t-addr", Name: "bad"},
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "tmpl-a", Replicas: ptr.To[int32](1),
			AddressPool: &computev1alpha1.AddressPool{Network: "10.90.0.0/24", Addresses: []string{"10.91.0.5"}}},
	}
	must(t, f.c.Create(ctx, bad))
	f.waitStalled(t, "t-addr", "bad", "AddressPoolInvalid", `spec.addressPool: address "10.91.0.5" is not within network 10.90.0.0/24`)
	must(t, f.c.Delete(ctx, bad)) // later steps expect every group to run
	testenv.Eventually(t, "the bad group gone", func() (bool, string) {
		err := f.c.Get(ctx, client.ObjectKeyFromObject(bad), &computev1alpha1.VmGroup{})
		return apierrors.IsNotFound(err), testenv.ErrString(err)
	})
}

// checkAddresses compares the group's recorded addresses and what its guests report with want.
func checkAddresses(t *testing.T, vg *computev1alpha1.VmGroup, want map[string]string) {
	t.Helper()
	recorded := map[string]string{}
	for _, a := range vg.Status.Addresses {
		recorded[a.VM] = strings.TrimSuffix(a.Address, "/24")
	}
	reported := map[string]string{}
	for _, vm := range vg.Status.VMs {
		reported[vm.Name] = vm.IP
	}
	if fmt.Sprint(recorded) != fmt.Sprint(want) || fmt.Sprint(reported) != fmt.Sprint(want) {
		t.Errorf("addresses recorded %v, reported by the guests %v; want %v", recorded, reported, want)
	}
}

type cloudInitMetadata struct {
	Network struct {
		Ethernets map[string]struct {
			Match struct {
				MAC string `json:"macaddress"`
			} `json:"match"`
			DHCP4     bool     `json:"dhcp4"`
			Addresses []string `json:"addresses"`
			Routes    []struct {
				To, Via string
			} `json:"routes"`
			Nameservers struct {
				Addresses []string `json:"addresses"`
			} `json:"nameservers"`
		} `json:"ethernets"`
	} `json:"network"`
}

func metadataOf(t *testing.T, f *fixture, vmPath string) cloudInitMetadata {
	t.Helper()
	i := strings.LastIndexByte(vmPath, '/')
	vm := f.sim.VMs(t, vmPath[:i])[vmPath[i+1:]]
	js, err := base64.StdEncoding.DecodeString(vm.ExtraConfig["guestinfo.metadata"])
	must(t, err)
	var md cloudInitMetadata
	must(t, json.Unmarshal(js, &md))
	return md
}
