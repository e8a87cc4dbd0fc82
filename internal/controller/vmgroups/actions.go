package vmgroups

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// group is what a reconcile works with: the VmGroup, its spec in vCenter's units, where its VMs
// go, and the vCenter session.
type group struct {
	vg        *computev1alpha1.VmGroup
	key       types.NamespacedName
	spec      vsphere.Spec
	boot      *bootData // nil: no first-boot data
	placement vcenter.Placement
	folder    vcenter.Folder
	api       vcenter.API
	shutdown  time.Duration
	aff       *affinity             // keeps the group's anti-affinity rule; nil when it has none to keep
	pool      *vsphere.Pool         // the group's static addresses; nil: DHCP
	addresses map[string]netip.Addr // VM name → its address of pool, recorded in the status
	// about is what the background operations' Events are about: a copy of the VmGroup's
	// identity, which the reconcile does not write while they run.
	about *computev1alpha1.VmGroup
}

func about(vg *computev1alpha1.VmGroup) *computev1alpha1.VmGroup {
	out := &computev1alpha1.VmGroup{}
	out.Namespace, out.Name, out.UID, out.ResourceVersion = vg.Namespace, vg.Name, vg.UID, vg.ResourceVersion
	return out
}

// startPlan starts the plan's operations in the background. It fails only when the clones'
// template or placement cannot be resolved, before anything starts.
func (r *Reconciler) startPlan(ctx context.Context, g *group, plan vsphere.Plan) *failure {
	for _, m := range plan.Delete {
		r.work.start(g.vg, m.Name, opDelete, "", func(ctx context.Context) (string, error) {
			return r.powerDown(ctx, g, m)
		})
	}
	for _, m := range plan.PowerOn {
		r.work.start(g.vg, m.Name, opPowerOn, "", func(ctx context.Context) (string, error) {
			if addr, ok := g.addresses[m.Name]; ok && g.pool != nil && m.Address != addr.String() {
				// Cloned, but stopped before its network configuration was written: written now,
				// before its first boot.
				if err := r.configureNetwork(ctx, g, m.Name, m.ID); err != nil {
					return "", err
				}
			}
			return "", r.powerOn(ctx, g, m.ID)
		})
	}
	if len(plan.Create) == 0 && plan.Replace == nil && plan.Reconfigure == nil {
		return nil
	}

	if len(plan.Create) > 0 || plan.Replace != nil {
		src, err := r.source(ctx, g)
		if err != nil {
			return classify(err)
		}
		for _, n := range plan.Create {
			name := vsphere.VMName(g.spec.Name, n)
			r.work.start(g.vg, name, opClone, "", func(ctx context.Context) (string, error) {
				return "", r.clone(ctx, g, src, name)
			})
		}
		if m := plan.Replace; m != nil {
			done := fmt.Sprintf("replaced %s: template %q → %q", m.Name, m.Template, g.spec.Template)
			switch {
			case m.Template != g.spec.Template:
			case m.Boot != g.spec.Boot:
				done = fmt.Sprintf("replaced %s: its first-boot data changed", m.Name)
			case g.spec.Linked && m.Snapshot != g.spec.Snapshot:
				done = fmt.Sprintf("replaced %s: linked clone of snapshot %q → %q", m.Name, m.Snapshot, g.spec.Snapshot)
			default:
				done = fmt.Sprintf("replaced %s: its data disks changed", m.Name)
			}
			r.work.start(g.vg, m.Name, opReplace, done, func(ctx context.Context) (string, error) {
				warning, err := r.powerDown(ctx, g, *m)
				if err == nil {
					err = r.clone(ctx, g, src, m.Name)
				}
				return warning, err
			})
		}
	}

	if m := plan.Reconfigure; m != nil {
		done := fmt.Sprintf("reconfigured %s: %d CPU, %d MB → %d CPU, %d MB", m.Name, m.CPU, m.MemoryMB, g.spec.CPU, g.spec.MemoryMB)
		grown := m.Grown(g.spec)
		for i, d := range grown {
			if d.SizeGiB != m.Disks[i].SizeGiB {
				done += fmt.Sprintf("; disk %s %d → %d GiB", d.Name, m.Disks[i].SizeGiB, d.SizeGiB)
			}
		}
		r.work.start(g.vg, m.Name, opReconfigure, done, func(ctx context.Context) (string, error) {
			warning, err := r.stop(ctx, g, *m)
			if err == nil {
				err = g.api.Reconfigure(ctx, m.ID, g.spec.CPU, g.spec.MemoryMB, grown)
			}
			// Power on even after a failed reconfigure: the VM should not stay down because of us.
			return warning, errors.Join(err, r.powerOn(ctx, g, m.ID))
		})
	}
	return nil
}

// source resolves the template and placement of the group's clones, once while the group changes.
func (r *Reconciler) source(ctx context.Context, g *group) (*vcenter.Source, error) {
	t := vcenter.Template{Path: g.spec.Template, Linked: g.spec.Linked, Snapshot: g.spec.Snapshot, Disks: g.spec.Disks}
	id := fmt.Sprintf("%+v|%+v", t, g.placement)
	if src := r.work.cachedSource(g.key, id); src != nil {
		return src, nil
	}
	src, err := g.api.Source(ctx, g.placement, t)
	if err != nil {
		return nil, err
	}
	r.work.keepSource(g.key, id, src)
	return src, nil
}

// powerDown stops a VM and destroys it; one already gone is fine. It returns a warning when the
// guest did not shut down in time and was powered off hard.
func (r *Reconciler) powerDown(ctx context.Context, g *group, m vsphere.Member) (string, error) {
	warning, err := r.stop(ctx, g, m)
	if err != nil {
		return warning, err
	}
	if err := g.api.Destroy(ctx, m.ID); err != nil {
		return warning, err
	}
	if g.aff != nil {
		change, err := g.aff.leave(ctx, g.api, m.ID)
		r.announceRule(g.about, g.aff, change)
		return warning, err
	}
	return warning, nil
}

// powerOn powers a member on; in a group kept apart, it joins the rule first, so vCenter places it
// on a host of its own.
func (r *Reconciler) powerOn(ctx context.Context, g *group, id string) error {
	if g.aff != nil {
		change, err := g.aff.join(ctx, g.api, id)
		r.announceRule(g.about, g.aff, change)
		if err != nil {
			return err
		}
	}
	return g.api.PowerOn(ctx, id)
}

// stop powers a VM off: it asks the guest to shut down when VMware Tools run in it and waits up to
// the group's shutdown timeout, then powers off hard.
func (r *Reconciler) stop(ctx context.Context, g *group, m vsphere.Member) (string, error) {
	if m.PowerState == vsphere.PoweredOff {
		return "", nil
	}
	warning := ""
	if m.PowerState == vsphere.PoweredOn && m.ToolsRunning && g.shutdown > 0 {
		off, err := g.api.ShutdownGuest(ctx, m.ID, g.shutdown)
		if err != nil || off {
			return "", err
		}
		warning = fmt.Sprintf("%s did not shut down within %s of the guest being asked to; powered off", m.Name, g.shutdown)
	}
	return warning, g.api.PowerOff(ctx, m.ID)
}

// clone makes one VM of the group, waiting for a slot shared by all groups.
func (r *Reconciler) clone(ctx context.Context, g *group, src *vcenter.Source, name string) error {
	sem := r.cloneSlots()
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return ctx.Err()
	}
	extra := map[string]string{vsphere.KeyGroup: g.spec.Key, vsphere.KeyTemplate: g.spec.Template}
	if mark := vsphere.DisksMark(src.Disks()); mark != "" {
		extra[vsphere.KeyDisks] = mark
	}
	if src.Linked() {
		extra[vsphere.KeySnapshot] = src.Snapshot()
	}
	if g.boot != nil {
		extra[vsphere.KeyBoot] = g.spec.Boot
		if g.pool == nil {
			g.boot.guestinfo(name, nil, extra)
		}
	}
	// A group kept apart, or of static addresses, clones powered off: the VM joins the rule, and
	// gets its network configuration (which names its adapter's MAC address), before it first runs.
	held := g.aff != nil || g.pool != nil
	id, err := g.api.Clone(ctx, src, g.folder, vcenter.CloneSpec{Name: name, CPU: g.spec.CPU, MemoryMB: g.spec.MemoryMB, ExtraConfig: extra, PoweredOff: held})
	if err != nil || !held {
		return err
	}
	if g.pool != nil {
		if err := r.configureNetwork(ctx, g, name, id); err != nil {
			// Never left to boot without its address (on DHCP): the next step clones it again.
			return errors.Join(err, g.api.Destroy(ctx, id))
		}
	}
	return r.powerOn(ctx, g, id)
}

// configureNetwork writes the VM's first-boot data with its static address for its first network
// adapter, matched by MAC address.
func (r *Reconciler) configureNetwork(ctx context.Context, g *group, name, id string) error {
	addr, ok := g.addresses[name]
	if !ok {
		return fmt.Errorf("%s has no address recorded", name) // allocate gives every clone one
	}
	mac, err := g.api.MAC(ctx, id)
	if err != nil {
		return err
	}
	if mac == "" {
		return fmt.Errorf("%s has no network adapter to give its address %s to: the template needs one", name, addr)
	}
	extra := map[string]string{vsphere.KeyAddress: addr.String()}
	g.boot.guestinfo(name, g.pool.NetworkConfig(mac, addr), extra)
	return g.api.SetExtraConfig(ctx, id, extra)
}

func (r *Reconciler) cloneSlots() chan struct{} {
	r.slotsOnce.Do(func() {
		if r.clones == nil {
			r.clones = make(chan struct{}, max(r.CloneConcurrency, 1))
		}
	})
	return r.clones
}

// announce records an Event for what the operations that ended did, and returns their errors.
func (r *Reconciler) announce(vg *computev1alpha1.VmGroup, ends []ended, toCreate int) error {
	names := map[opKind][]string{}
	var errs []error
	for _, e := range ends {
		if e.warning != "" {
			r.Recorder.Eventf(vg, nil, corev1.EventTypeWarning, "ShutdownTimedOut", "PowerOff", "%s", e.warning)
		}
		if e.err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", e.kind, e.vm, e.err))
			continue
		}
		if e.done != "" {
			reason := "VMReplaced"
			if e.kind == opReconfigure {
				reason = "VMReconfigured"
			}
			r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, reason, "RollingUpdate", "%s", e.done)
			continue
		}
		names[e.kind] = append(names[e.kind], e.vm)
	}
	list := func(k opKind) string {
		slices.SortFunc(names[k], vsphere.CompareVMNames)
		return strings.Join(names[k], ", ")
	}
	if len(names[opClone]) > 0 {
		msg := "created " + list(opClone)
		if toCreate > 0 {
			msg += fmt.Sprintf(" (%d more to create)", toCreate)
		}
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "VMsCreated", "ScaleUp", "%s", msg)
	}
	if len(names[opDelete]) > 0 {
		action := "ScaleDown"
		if !vg.DeletionTimestamp.IsZero() {
			action = "Delete"
		}
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "VMsDeleted", action, "deleted %s", list(opDelete))
	}
	if len(names[opPowerOn]) > 0 {
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "VMsPoweredOn", "Repair", "powered on %s: found powered off or suspended", list(opPowerOn))
	}
	return errors.Join(errs...)
}
