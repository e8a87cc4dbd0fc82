package vsphere

import (
	"context"
	"fmt"
	"slices"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// Cluster is the compute resource a placement's resource pool belongs to: a DRS cluster, or a
// standalone host (no DRS rule can apply there).
type Cluster struct {
	Name       string
	Standalone bool
	ref        types.ManagedObjectReference
}

// Cluster resolves the compute resource of the placement's resource pool.
func (c *Client) Cluster(ctx context.Context, p Placement) (Cluster, error) {
	finder, err := c.finderIn(ctx, p)
	if err != nil {
		return Cluster{}, err
	}
	pool, err := c.resourcePool(ctx, finder, p)
	if err != nil {
		return Cluster{}, err
	}
	var rp mo.ResourcePool
	if err := pool.Properties(ctx, pool.Reference(), []string{"owner"}, &rp); err != nil {
		return Cluster{}, c.redact(err)
	}
	name, err := object.NewCommon(c.vim, rp.Owner).ObjectName(ctx)
	if err != nil {
		return Cluster{}, c.redact(err)
	}
	return Cluster{Name: name, Standalone: rp.Owner.Type != "ClusterComputeResource", ref: rp.Owner}, nil
}

// Rule is a VM-VM anti-affinity rule of a cluster: its members run on separate hosts. Mandatory
// rules keep a VM powered off rather than break them; others are DRS's preference.
type Rule struct {
	Key       int32 // vCenter's; 0 for a rule not made yet
	Name      string
	Mandatory bool
	Enabled   bool
	VMs       []string // managed object ids, sorted
}

// Affinity is what a cluster says about one anti-affinity rule.
type Affinity struct {
	// DRS reports whether DRS is on: vCenter applies VM-VM rules only then.
	DRS bool
	// Rule is the rule of the name asked for; nil when there is none.
	Rule *Rule
}

// Affinity reads the cluster's DRS switch and its anti-affinity rule called name: one property
// read. A rule of that name of another kind is an InvalidError.
func (c *Client) Affinity(ctx context.Context, cl Cluster, name string) (Affinity, error) {
	var cr mo.ClusterComputeResource
	if err := object.NewCommon(c.vim, cl.ref).Properties(ctx, cl.ref, []string{"configurationEx"}, &cr); err != nil {
		return Affinity{}, c.redact(err)
	}
	cfg, ok := cr.ConfigurationEx.(*types.ClusterConfigInfoEx)
	if !ok {
		return Affinity{}, fmt.Errorf("cluster %q: no cluster configuration", cl.Name)
	}
	out := Affinity{DRS: cfg.DrsConfig.Enabled != nil && *cfg.DrsConfig.Enabled}
	for _, base := range cfg.Rule {
		info := base.GetClusterRuleInfo()
		if info.Name != name {
			continue
		}
		anti, ok := base.(*types.ClusterAntiAffinityRuleSpec)
		if !ok {
			return out, &InvalidError{Kind: "cluster", Name: cl.Name, Problem: fmt.Sprintf("has a rule named %q that is not a VM-VM anti-affinity rule: rename or remove it", name)}
		}
		r := &Rule{Key: info.Key, Name: info.Name, Mandatory: isTrue(info.Mandatory), Enabled: isTrue(info.Enabled)}
		for _, vm := range anti.Vm {
			r.VMs = append(r.VMs, vm.Value)
		}
		slices.Sort(r.VMs)
		out.Rule = r
		break
	}
	return out, nil
}

// PutRule makes the rule (Key 0) or replaces the one of its key with it, enabled.
func (c *Client) PutRule(ctx context.Context, cl Cluster, r Rule) error {
	info := &types.ClusterAntiAffinityRuleSpec{
		ClusterRuleInfo: types.ClusterRuleInfo{Key: r.Key, Name: r.Name, Enabled: types.NewBool(true), Mandatory: types.NewBool(r.Mandatory)},
	}
	for _, id := range r.VMs {
		info.Vm = append(info.Vm, types.ManagedObjectReference{Type: "VirtualMachine", Value: id})
	}
	op := types.ArrayUpdateOperationEdit
	if r.Key == 0 {
		op = types.ArrayUpdateOperationAdd
	}
	return c.reconfigureCluster(ctx, cl, types.ClusterRuleSpec{ArrayUpdateSpec: types.ArrayUpdateSpec{Operation: op}, Info: info})
}

// RemoveRule removes the rule of the key; one gone already is not an error.
func (c *Client) RemoveRule(ctx context.Context, cl Cluster, key int32) error {
	err := c.reconfigureCluster(ctx, cl, types.ClusterRuleSpec{ArrayUpdateSpec: types.ArrayUpdateSpec{Operation: types.ArrayUpdateOperationRemove, RemoveKey: key}})
	if fault.Is(err, &types.InvalidArgument{}) {
		return nil // vCenter's answer to a key it does not hold
	}
	return err
}

func (c *Client) reconfigureCluster(ctx context.Context, cl Cluster, rule types.ClusterRuleSpec) error {
	spec := &types.ClusterConfigSpecEx{RulesSpec: []types.ClusterRuleSpec{rule}}
	cr := object.NewClusterComputeResource(c.vim, cl.ref)
	return c.wait(ctx, func(ctx context.Context) (*object.Task, error) { return cr.Reconfigure(ctx, spec, true) })
}

// Unplaceable reports whether vCenter refused to power a VM on because that would break an
// affinity or anti-affinity rule (RuleViolation): no host is left that keeps the rule.
func Unplaceable(err error) bool { return fault.Is(err, &types.RuleViolation{}) }

func isTrue(b *bool) bool { return b != nil && *b }
