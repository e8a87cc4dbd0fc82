package vmgroups

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// affinity is a group's DRS anti-affinity rule: the cluster it lives in and the VMs it must hold.
// The reconciles set the members from a listing when nothing runs for the group; the operations in
// flight add the VMs they clone (before those power on) and drop the ones they destroy. One lock
// orders every read-and-write of the rule, since vCenter replaces a rule's VM list whole.
type affinity struct {
	cluster vcenter.Cluster
	name    string

	mu        sync.Mutex
	mandatory bool            // the group's strictness, as last reconciled
	vms       map[string]bool // ids the rule must hold
	exists    bool            // the rule was there at the last read or write
	drs       bool            // DRS was on at the last read
	dropped   bool            // the group no longer asks for the rule: operations in flight leave it alone
}

// setMandatory changes the strictness the next write gives the rule.
func (a *affinity) setMandatory(m bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.mandatory = m
}

func (a *affinity) isMandatory() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mandatory
}

// drop stops every later write of this keeper (the group's rule is removed by dropRule).
func (a *affinity) drop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropped = true
}

func (a *affinity) drsOn() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.drs
}

func (a *affinity) ruleExists() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.exists
}

// ruleChange is what a write of the rule did, for an Event; "" when nothing to announce.
type ruleChange string

const (
	ruleCreated  ruleChange = "created"
	ruleUpdated  ruleChange = "updated"  // its strictness follows the spec
	ruleRepaired ruleChange = "repaired" // someone had changed it
	ruleRemoved  ruleChange = "removed"
)

// sync makes the rule hold exactly want, the group's members, enabled and with the group's
// strictness; what else differs was changed by someone and is repaired. One read; a write only
// when the rule differs.
func (a *affinity) sync(ctx context.Context, api vcenter.API, want map[string]bool) (ruleChange, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.vms = want
	return a.writeLocked(ctx, api, true)
}

// read learns whether the rule exists and DRS is on, writing nothing.
func (a *affinity) read(ctx context.Context, api vcenter.API) error {
	state, err := api.Affinity(ctx, a.cluster, a.name)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.exists, a.drs = state.Rule != nil, state.DRS
	if state.Rule != nil {
		for _, id := range state.Rule.VMs {
			a.vms[id] = true
		}
	}
	return nil
}

// join adds a VM to the rule before it powers on.
func (a *affinity) join(ctx context.Context, api vcenter.API, id string) (ruleChange, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.vms[id] = true
	return a.writeLocked(ctx, api, false)
}

// leave drops a destroyed VM from the rule.
func (a *affinity) leave(ctx context.Context, api vcenter.API, id string) (ruleChange, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.vms[id] {
		return "", nil
	}
	delete(a.vms, id)
	return a.writeLocked(ctx, api, false)
}

// writeLocked brings the rule to a.vms; the rule is removed while fewer than two VMs remain (a rule
// of one VM constrains nothing). Differences a step of ours makes (a VM joining or leaving) are not
// announced; at a full sync, a rule that lacks members, holds others or is disabled was changed by
// someone.
func (a *affinity) writeLocked(ctx context.Context, api vcenter.API, full bool) (ruleChange, error) {
	if a.dropped {
		return "", nil
	}
	state, err := api.Affinity(ctx, a.cluster, a.name)
	if err != nil {
		return "", err
	}
	have := state.Rule
	a.exists, a.drs = have != nil, state.DRS
	want := slices.Sorted(maps.Keys(a.vms))
	switch {
	case len(want) < 2 && have == nil:
		return "", nil
	case len(want) < 2:
		if err := api.RemoveRule(ctx, a.cluster, have.Key); err != nil {
			return "", err
		}
		a.exists = false
		return ruleRemoved, nil
	case have != nil && have.Enabled && have.Mandatory == a.mandatory && slices.Equal(have.VMs, want):
		return "", nil
	}
	rule := vcenter.Rule{Name: a.name, Mandatory: a.mandatory, VMs: want}
	var change ruleChange
	switch {
	case have == nil:
		change = ruleCreated
	case !have.Enabled || full && holdsOthers(have.VMs, want):
		// Disabled, or holding VMs that are not the group's: someone changed it. Members it lacks
		// are added without a word (a join of ours that failed, a group whose rule was not applied).
		rule.Key, change = have.Key, ruleRepaired
	case have.Mandatory != a.mandatory:
		rule.Key, change = have.Key, ruleUpdated
	default:
		rule.Key = have.Key
	}
	if err := api.PutRule(ctx, a.cluster, rule); err != nil {
		return "", err
	}
	a.exists = true
	return change, nil
}

// holdsOthers reports whether have names a VM that want does not.
func holdsOthers(have, want []string) bool {
	for _, id := range have {
		if !slices.Contains(want, id) {
			return true
		}
	}
	return false
}

// keepApart keeps the group's anti-affinity rule, setting g.aff to its keeper: nil when the group
// has none to keep (no antiAffinity; or Preferred where vCenter cannot apply it, said in note). The
// cluster is resolved once per placement and kept for the group's life. When nothing runs for the
// group (quiet) the rule is read and brought to the group's members, a rule someone changed
// repaired with an Event (one read, a write only when it differs); otherwise the operations in
// flight keep it. A Required rule vCenter cannot apply (a standalone host, DRS off) stalls the group
// before anything is cloned.
func (r *Reconciler) keepApart(ctx context.Context, g *group, obs vsphere.Observation, quiet bool) (note string, f *failure) {
	mode := antiAffinity(g.vg)
	if mode == "" {
		return "", r.dropRule(ctx, g)
	}
	// One keeper per group and placement (its cluster); the strictness follows the spec under the
	// keeper's lock, so operations in flight and this step never write the rule apart.
	id := fmt.Sprintf("%+v", g.placement)
	a := r.work.affinity(g.key, id)
	if a != nil {
		a.setMandatory(mode == computev1alpha1.AntiAffinityRequired)
	} else {
		cl, err := g.api.Cluster(ctx, g.placement)
		if err != nil {
			return "", classify(err)
		}
		a = &affinity{cluster: cl, name: vsphere.RuleName(g.vg.Namespace, g.vg.Name), mandatory: mode == computev1alpha1.AntiAffinityRequired, vms: map[string]bool{}}
		if !cl.Standalone && !quiet {
			// Operations of an earlier keeper still run: learn the cluster's state without writing.
			if err := a.read(ctx, g.api); err != nil {
				return "", classify(err)
			}
		}
		r.work.keepAffinity(g.key, id, a)
	}
	problem := ""
	if a.cluster.Standalone {
		problem = fmt.Sprintf("the resource pool belongs to the standalone host %q, not a cluster: DRS rules apply only in a cluster", a.cluster.Name)
	} else {
		if quiet {
			want := map[string]bool{}
			for _, m := range obs.Members {
				want[m.ID] = true
			}
			change, err := a.sync(ctx, g.api, want)
			if err != nil {
				return "", classify(err)
			}
			r.announceRule(g.vg, a, change)
		}
		if !a.drsOn() {
			problem = fmt.Sprintf("DRS is off in cluster %q: vCenter applies no VM-VM rule; turn DRS on", a.cluster.Name)
		}
	}
	if a.ruleExists() {
		g.vg.Status.AntiAffinityRule = a.name
	} else {
		g.vg.Status.AntiAffinityRule = ""
	}
	switch {
	case problem == "":
		g.aff = a
		return "", nil
	case a.isMandatory():
		return "", stalled("AntiAffinityUnavailable", "placement.antiAffinity is Required, but "+problem+
			", or set antiAffinity: Preferred to run the VMs without it; nothing is cloned until then")
	}
	return "; antiAffinity Preferred is not applied: " + problem, nil
}

// antiAffinity is the group's placement.antiAffinity ("" when none).
func antiAffinity(vg *computev1alpha1.VmGroup) computev1alpha1.AntiAffinity {
	if p := vg.Spec.Placement; p != nil {
		return p.AntiAffinity
	}
	return ""
}

func (r *Reconciler) announceRule(vg *computev1alpha1.VmGroup, a *affinity, change ruleChange) {
	switch change {
	case ruleCreated:
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "AntiAffinityRuleCreated", "Place",
			"created DRS rule %q in cluster %q: the group's VMs run on separate hosts (%s)", a.name, a.cluster.Name, strictness(a))
	case ruleUpdated:
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "AntiAffinityRuleUpdated", "Place",
			"DRS rule %q in cluster %q is now %s", a.name, a.cluster.Name, strictness(a))
	case ruleRepaired:
		r.Recorder.Eventf(vg, nil, corev1.EventTypeWarning, "AntiAffinityRuleRepaired", "Place",
			"DRS rule %q in cluster %q had been changed outside Quartermaster: it holds the group's VMs again, enabled, %s", a.name, a.cluster.Name, strictness(a))
	case ruleRemoved:
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "AntiAffinityRuleRemoved", "Place",
			"removed DRS rule %q from cluster %q: fewer than two VMs left to keep apart", a.name, a.cluster.Name)
	}
}

func strictness(a *affinity) string {
	if a.isMandatory() {
		return "required"
	}
	return "preferred"
}

// dropRule removes the group's rule when the group no longer asks for one but the status says it
// made one, and when the group is deleted.
func (r *Reconciler) dropRule(ctx context.Context, g *group) *failure {
	kept := r.work.dropAffinity(g.key) // operations in flight stop writing the rule
	name := g.vg.Status.AntiAffinityRule
	if name == "" && (kept || !g.vg.DeletionTimestamp.IsZero() && antiAffinity(g.vg) != "") {
		// Made by an operation of this manager, or by a step whose status was not written.
		name = vsphere.RuleName(g.vg.Namespace, g.vg.Name)
	}
	if name == "" {
		return nil
	}
	cl, err := g.api.Cluster(ctx, g.placement)
	if errors.Is(err, vcenter.ErrNotFound) {
		err = nil // the pool or its datacenter is gone, and the rule with it
	}
	if err != nil {
		return classify(err)
	}
	if cl.Name != "" && !cl.Standalone {
		state, err := g.api.Affinity(ctx, cl, name)
		if err != nil {
			return classify(err)
		}
		if state.Rule != nil {
			if err := g.api.RemoveRule(ctx, cl, state.Rule.Key); err != nil {
				return classify(err)
			}
			r.Recorder.Eventf(g.vg, nil, corev1.EventTypeNormal, "AntiAffinityRuleRemoved", "Place",
				"removed DRS rule %q from cluster %q", state.Rule.Name, cl.Name)
		}
	}
	g.vg.Status.AntiAffinityRule = ""
	return nil
}

// unplaced are the VMs whose power-on vCenter refused for a rule, from the operations that ended.
func unplaced(ends []ended) []string {
	var out []string
	for _, e := range ends {
		if e.err != nil && vcenter.Unplaceable(e.err) {
			out = append(out, e.vm)
		}
	}
	slices.SortFunc(out, vsphere.CompareVMNames)
	return slices.Compact(out)
}

// unplaceable is the failure of a Required group vCenter could not place every member of.
func unplaceable(vg *computev1alpha1.VmGroup, names []string) *failure {
	return stalled("AntiAffinityUnsatisfiable", fmt.Sprintf(
		"%s cannot be placed: placement.antiAffinity Required gives each VM of the group a host of its own, and vCenter found no usable host left for DRS rule %q; they stay powered off until a host is added (or leaves maintenance), spec.replicas is lowered, or antiAffinity is Preferred",
		strings.Join(names, ", "), vsphere.RuleName(vg.Namespace, vg.Name)))
}
