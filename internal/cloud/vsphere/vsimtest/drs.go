package vsimtest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/property"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// DRS: vcsim v0.56.0 stores a cluster's rules but never applies them (a clone lands on its
// template's host, a power-on stays where the VM is). The Sim's wrapper plays DRS's part at a
// power-on, the moment vCenter applies VM-VM anti-affinity rules to a VM that is not yet running:
// in a cluster with DRS on, a VM in an enabled anti-affinity rule is moved to a connected host,
// out of maintenance, that runs no other powered-on VM of the rule; when there is none, a
// mandatory rule refuses the power-on with RuleViolation (the fault vCenter documents for "the
// virtual machine, if powered on, would violate an affinity/anti-affinity rule"), an optional one
// lets the VM run where it is.

// Cluster is the model's DRS cluster, which holds the default resource pool.
const Cluster = "DC0_C0"

// place is the wrapper's look at a power-on before vcsim carries it out: nil to go on, or the fault
// vCenter answers. Callers hold taskMu.
func (s *Sim) place(ctx context.Context, vmRef types.ManagedObjectReference) error {
	pc := property.DefaultCollector(s.unwrapped)
	var vm mo.VirtualMachine
	if err := pc.RetrieveOne(ctx, vmRef, []string{"runtime.host", "runtime.powerState"}, &vm); err != nil {
		return err
	}
	if vm.Runtime.Host == nil || vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn {
		return nil
	}
	var host mo.HostSystem
	if err := pc.RetrieveOne(ctx, *vm.Runtime.Host, []string{"parent"}, &host); err != nil {
		return err
	}
	if host.Parent == nil || host.Parent.Type != "ClusterComputeResource" {
		return nil
	}
	var cl mo.ClusterComputeResource
	if err := pc.RetrieveOne(ctx, *host.Parent, []string{"configurationEx", "host"}, &cl); err != nil {
		return err
	}
	cfg := cl.ConfigurationEx.(*types.ClusterConfigInfoEx)
	if cfg.DrsConfig.Enabled == nil || !*cfg.DrsConfig.Enabled {
		return nil
	}
	taken := map[types.ManagedObjectReference]bool{}
	var mandatory *types.ClusterAntiAffinityRuleSpec
	for _, base := range cfg.Rule {
		rule, ok := base.(*types.ClusterAntiAffinityRuleSpec)
		if !ok || rule.Enabled == nil || !*rule.Enabled || !slices.Contains(rule.Vm, vmRef) {
			continue
		}
		if rule.Mandatory != nil && *rule.Mandatory && mandatory == nil {
			mandatory = rule
		}
		for _, other := range rule.Vm {
			if other == vmRef {
				continue
			}
			var o mo.VirtualMachine
			if err := pc.RetrieveOne(ctx, other, []string{"runtime.host", "runtime.powerState"}, &o); err != nil {
				continue // gone
			}
			if o.Runtime.Host != nil && o.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn {
				taken[*o.Runtime.Host] = true
			}
		}
	}
	if !taken[*vm.Runtime.Host] {
		return nil
	}
	var hosts []mo.HostSystem
	if len(cl.Host) > 0 {
		if err := pc.Retrieve(ctx, cl.Host, []string{"runtime"}, &hosts); err != nil {
			return err
		}
	}
	for _, h := range hosts {
		if taken[h.Self] || h.Runtime.ConnectionState != types.HostSystemConnectionStateConnected || h.Runtime.InMaintenanceMode {
			continue
		}
		ref := h.Self
		task, err := object.NewVirtualMachine(s.unwrapped, vmRef).Relocate(ctx, types.VirtualMachineRelocateSpec{Host: &ref}, types.VirtualMachineMovePriorityDefaultPriority)
		if err == nil {
			err = task.Wait(ctx)
		}
		return err
	}
	if mandatory == nil {
		return nil // DRS keeps to an optional rule only while it can
	}
	f := &soap.Fault{Code: "ServerFaultCode", String: fmt.Sprintf("The virtual machine, if powered on, would violate anti-affinity rule %q", mandatory.Name)}
	f.Detail.Fault = &types.RuleViolation{Host: vm.Runtime.Host, Rule: mandatory}
	return soap.WrapSoapFault(f)
}

// cluster is the model's cluster.
func (s *Sim) cluster(t testing.TB) *object.ClusterComputeResource {
	t.Helper()
	cl, err := s.finder().ClusterComputeResource(context.Background(), Cluster)
	must(t, err)
	return cl
}

// SetDRS switches DRS of the model's cluster on or off.
func (s *Sim) SetDRS(t testing.TB, on bool) {
	t.Helper()
	s.reconfigureCluster(t, &types.ClusterConfigSpecEx{DrsConfig: &types.ClusterDrsConfigInfo{Enabled: types.NewBool(on)}})
}

func (s *Sim) reconfigureCluster(t testing.TB, spec *types.ClusterConfigSpecEx) {
	t.Helper()
	ctx := context.Background()
	task, err := s.cluster(t).Reconfigure(ctx, spec, true)
	must(t, err)
	must(t, task.Wait(ctx))
}

// ruleNamed is the model cluster's anti-affinity rule called name, nil when there is none.
func (s *Sim) ruleNamed(t testing.TB, name string) *types.ClusterAntiAffinityRuleSpec {
	t.Helper()
	var cl mo.ClusterComputeResource
	must(t, s.cluster(t).Properties(context.Background(), s.cluster(t).Reference(), []string{"configurationEx"}, &cl))
	for _, base := range cl.ConfigurationEx.(*types.ClusterConfigInfoEx).Rule {
		if rule, ok := base.(*types.ClusterAntiAffinityRuleSpec); ok && rule.Name == name {
			return rule
		}
	}
	return nil
}

// AntiAffinityRule returns the model cluster's rule called name (nil: none), its VMs by name.
func (s *Sim) AntiAffinityRule(t testing.TB, name string) *AntiAffinity {
	t.Helper()
	ctx := context.Background()
	if rule := s.ruleNamed(t, name); rule != nil {
		out := &AntiAffinity{Key: rule.Key, Mandatory: rule.Mandatory != nil && *rule.Mandatory, Enabled: rule.Enabled != nil && *rule.Enabled}
		for _, vm := range rule.Vm {
			n, err := object.NewCommon(s.Admin.Client, vm).ObjectName(ctx)
			if err != nil {
				n = vm.Value + " (gone)"
			}
			out.VMs = append(out.VMs, n)
		}
		slices.Sort(out.VMs)
		return out
	}
	return nil
}

// AntiAffinity is a cluster's anti-affinity rule as the Sim reads it.
type AntiAffinity struct {
	Key                int32
	Mandatory, Enabled bool
	VMs                []string // names
}

// EditRule changes the model cluster's rule called name out of band (as a person in the vSphere
// Client would): edit gets the rule to change.
func (s *Sim) EditRule(t testing.TB, name string, edit func(*types.ClusterAntiAffinityRuleSpec)) {
	t.Helper()
	rule := s.ruleNamed(t, name)
	if rule == nil {
		t.Fatalf("cluster %s has no rule %q", Cluster, name)
	}
	edit(rule)
	s.reconfigureCluster(t, &types.ClusterConfigSpecEx{RulesSpec: []types.ClusterRuleSpec{{
		ArrayUpdateSpec: types.ArrayUpdateSpec{Operation: types.ArrayUpdateOperationEdit}, Info: rule}}})
}

// Hosts returns the host each VM directly in a folder runs on (or is registered on), by VM name.
func (s *Sim) Hosts(t testing.TB, folderPath string) map[string]string {
	t.Helper()
	ctx := context.Background()
	c := s.Admin.Client
	ref, err := object.NewSearchIndex(c).FindByInventoryPath(ctx, folderPath)
	must(t, err)
	out := map[string]string{}
	if ref == nil {
		return out
	}
	children, err := object.NewFolder(c, ref.Reference()).Children(ctx)
	must(t, err)
	for _, ch := range children {
		if ch.Reference().Type != "VirtualMachine" {
			continue
		}
		var vm mo.VirtualMachine
		must(t, property.DefaultCollector(c).RetrieveOne(ctx, ch.Reference(), []string{"name", "runtime.host"}, &vm))
		if vm.Runtime.Host != nil {
			out[vm.Name], err = object.NewCommon(c, *vm.Runtime.Host).ObjectName(ctx)
			must(t, err)
		}
	}
	return out
}

// ClusterHosts is the number of hosts of the model's cluster.
func (s *Sim) ClusterHosts(t testing.TB) int {
	t.Helper()
	hosts, err := s.cluster(t).Hosts(context.Background())
	must(t, err)
	return len(hosts)
}

// SetMaintenance puts the cluster's host called name in or out of maintenance mode: DRS places
// nothing on a host in maintenance.
func (s *Sim) SetMaintenance(t testing.TB, name string, on bool) {
	t.Helper()
	ctx := context.Background()
	h, err := s.finder().HostSystem(ctx, name)
	must(t, err)
	var task *object.Task
	if on {
		task, err = h.EnterMaintenanceMode(ctx, 0, false, nil)
	} else {
		task, err = h.ExitMaintenanceMode(ctx, 0)
	}
	must(t, err)
	must(t, task.Wait(ctx))
}
