package vmgroups

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// act carries out one plan step and says what it did, and the reason to show while progressing.
func (r *Reconciler) act(ctx context.Context, api vcenter.API, vg *computev1alpha1.VmGroup, s vsphere.Spec,
	p vcenter.Placement, folder vcenter.Folder, plan vsphere.Plan) (done []string, reason string, err error) {
	reason = "Scaling"
	if len(plan.Delete) > 0 {
		names, err := r.each(ctx, plan.Delete, func(ctx context.Context, m vsphere.Member) error { return remove(ctx, api, m) })
		if len(names) > 0 {
			done = append(done, "deleted "+strings.Join(names, ", "))
			r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "VMsDeleted", "ScaleDown", "deleted %s", strings.Join(names, ", "))
		}
		if err != nil {
			return done, reason, err
		}
	}

	if len(plan.PowerOn) > 0 {
		if len(plan.Delete) == 0 && len(plan.Create) == 0 {
			reason = "Repairing"
		}
		names, err := r.each(ctx, plan.PowerOn, func(ctx context.Context, m vsphere.Member) error { return api.PowerOn(ctx, m.ID) })
		if len(names) > 0 {
			done = append(done, "powered on "+strings.Join(names, ", "))
			r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "VMsPoweredOn", "Repair",
				"powered on %s: found powered off or suspended", strings.Join(names, ", "))
		}
		if err != nil {
			return done, reason, err
		}
	}

	if len(plan.Create) > 0 {
		src, err := api.Source(ctx, p, s.Template)
		if err != nil {
			return done, reason, err
		}
		members := make([]vsphere.Member, 0, len(plan.Create))
		for _, n := range plan.Create {
			members = append(members, vsphere.Member{VM: vsphere.VM{Name: vsphere.VMName(s.Name, n)}, Ordinal: n})
		}
		names, err := r.each(ctx, members, func(ctx context.Context, m vsphere.Member) error {
			return r.clone(ctx, api, src, folder, s, m.Name)
		})
		if len(names) > 0 {
			msg := "created " + strings.Join(names, ", ")
			if rest := plan.Missing - len(names); rest > 0 {
				msg += fmt.Sprintf(" (%d more to create)", rest)
			}
			done = append(done, msg)
			r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "VMsCreated", "ScaleUp", "%s", msg)
		}
		if err != nil {
			return done, reason, err
		}
	}

	if m := plan.Replace; m != nil {
		reason = "RollingUpdate"
		// Resolve the new template before taking the VM down.
		src, err := api.Source(ctx, p, s.Template)
		if err != nil {
			return done, reason, err
		}
		if err := remove(ctx, api, *m); err != nil {
			return done, reason, err
		}
		if err := r.clone(ctx, api, src, folder, s, m.Name); err != nil {
			return done, reason, err
		}
		msg := fmt.Sprintf("replaced %s: template %q → %q", m.Name, m.Template, s.Template)
		done = append(done, msg)
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "VMReplaced", "RollingUpdate", "%s", msg)
	}

	if m := plan.Reconfigure; m != nil {
		reason = "RollingUpdate"
		err := api.PowerOff(ctx, m.ID)
		if err == nil {
			err = api.Reconfigure(ctx, m.ID, s.CPU, s.MemoryMB)
		}
		// Power on even after a failed reconfigure: the VM should not stay down because of us.
		err = errors.Join(err, api.PowerOn(ctx, m.ID))
		if err != nil {
			return done, reason, err
		}
		msg := fmt.Sprintf("reconfigured %s: %d CPU, %d MB → %d CPU, %d MB", m.Name, m.CPU, m.MemoryMB, s.CPU, s.MemoryMB)
		done = append(done, msg)
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "VMReconfigured", "RollingUpdate", "%s", msg)
	}
	return done, reason, nil
}

// remove powers a VM off and destroys it; one already gone is fine.
func remove(ctx context.Context, api vcenter.API, m vsphere.Member) error {
	if m.PowerState != vsphere.PoweredOff {
		if err := api.PowerOff(ctx, m.ID); err != nil {
			return err
		}
	}
	return api.Destroy(ctx, m.ID)
}

// clone makes one VM of the group, waiting for a slot shared by all groups.
func (r *Reconciler) clone(ctx context.Context, api vcenter.API, src *vcenter.Source, folder vcenter.Folder, s vsphere.Spec, name string) error {
	sem := r.cloneSlots()
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return ctx.Err()
	}
	_, err := api.Clone(ctx, src, folder, vcenter.CloneSpec{
		Name: name, CPU: s.CPU, MemoryMB: s.MemoryMB,
		ExtraConfig: map[string]string{vsphere.KeyGroup: s.Key, vsphere.KeyTemplate: s.Template},
	})
	return err
}

func (r *Reconciler) cloneSlots() chan struct{} {
	r.slotsOnce.Do(func() {
		if r.clones == nil {
			r.clones = make(chan struct{}, max(r.CloneConcurrency, 1))
		}
	})
	return r.clones
}

// each runs f on the members, at most CloneConcurrency at a time, and returns the names it
// succeeded on (in order) and every error.
func (r *Reconciler) each(ctx context.Context, ms []vsphere.Member, f func(context.Context, vsphere.Member) error) ([]string, error) {
	errs := make([]error, len(ms))
	limit := make(chan struct{}, max(r.CloneConcurrency, 1))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			limit <- struct{}{}
			defer func() { <-limit }()
			if err := f(ctx, m); err != nil {
				errs[i] = fmt.Errorf("%s: %w", m.Name, err)
			}
		})
	}
	wg.Wait()
	var names []string
	for i, m := range ms {
		if errs[i] == nil {
			names = append(names, m.Name)
		}
	}
	return names, errors.Join(errs...)
}
