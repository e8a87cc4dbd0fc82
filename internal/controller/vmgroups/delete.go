package vmgroups

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// reconcileDelete shuts down and destroys the group's VMs, then its folder when nothing else is in
// it, then drops the finalizer. released says the finalizer is gone.
func (r *Reconciler) reconcileDelete(ctx context.Context, vg *computev1alpha1.VmGroup) (reconcile.Result, bool, error) {
	if !controllerutil.ContainsFinalizer(vg, Finalizer) {
		return reconcile.Result{}, true, nil
	}
	key := client.ObjectKeyFromObject(vg)
	keep := fmt.Sprintf("; the VmGroup stays until its VMs are deleted (remove the finalizer %s to leave them behind)", Finalizer)
	// Operations in flight end first (a clone ending after the folder is gone would leave a VM
	// nobody knows of); each end wakes the group.
	if n := r.work.running(key); n > 0 {
		r.report(vg, computev1alpha1.PhaseDeleting, status.Progressing("Deleting", fmt.Sprintf("waiting for %d operation(s) in flight to end", n), r.Resync).Silenced())
		return reconcile.Result{RequeueAfter: r.Resync}, false, nil
	}
	ends, _ := r.work.take(key)
	if err := r.announce(vg, ends, 0); err != nil {
		fl := vcenterFailure(err)
		fl.Message += keep
		res, err := r.fail(vg, fl)
		return res, false, err
	}
	api, f := r.connect(ctx)
	if f != nil {
		f.Message += keep
		res, err := r.fail(vg, f)
		return res, false, err
	}
	// The group's DRS rule goes once its VMs are gone.
	dropRuleAndRelease := func() (reconcile.Result, bool, error) {
		if f := r.dropRule(ctx, &group{vg: vg, api: api, placement: r.placement(vg)}); f != nil {
			f.Message += keep
			res, err := r.fail(vg, f)
			return res, false, err
		}
		return r.release(ctx, vg)
	}
	folder, f := r.folder(ctx, api, vg, r.placement(vg), false)
	if f != nil {
		if f.Reason != "PlacementNotFound" { // no folder: nothing was created, or it is gone already
			f.Message += keep
			res, err := r.fail(vg, f)
			return res, false, err
		}
		return dropRuleAndRelease()
	}
	listing, err := api.List(ctx, folder)
	if errors.Is(err, vcenter.ErrNotFound) {
		return dropRuleAndRelease()
	}
	if err != nil {
		res, err := r.fail(vg, vcenterFailure(err))
		return res, false, err
	}
	s := spec(vg)
	obs := vsphere.Observe(s, listing.VMs, nil)
	if len(obs.Members) > 0 {
		g := &group{vg: vg, key: key, spec: s, api: api, folder: folder, shutdown: shutdownTimeout(vg)}
		names := make([]string, 0, len(obs.Members))
		for _, m := range obs.Members {
			r.work.start(vg, m.Name, opDelete, "", func(ctx context.Context) (string, error) { return r.powerDown(ctx, g, m) })
			names = append(names, m.Name)
		}
		r.report(vg, computev1alpha1.PhaseDeleting, status.Progressing("Deleting", "deleting "+strings.Join(names, ", "), r.Resync).Silenced())
		return reconcile.Result{RequeueAfter: r.Resync}, false, nil
	}

	// vCenter destroys a folder with everything in it: look again right before, and keep a folder
	// that holds anything the group does not own.
	after, err := api.List(ctx, folder)
	if err != nil && !errors.Is(err, vcenter.ErrNotFound) {
		res, err := r.fail(vg, vcenterFailure(err))
		return res, false, err
	}
	if err == nil {
		if len(after.VMs) == 0 && after.Others == 0 {
			if err := api.DestroyFolder(ctx, folder); err != nil {
				res, err := r.fail(vg, vcenterFailure(err))
				return res, false, err
			}
		} else {
			var left []string
			for _, vm := range after.VMs {
				left = append(left, vm.Name)
			}
			r.Recorder.Eventf(vg, nil, corev1.EventTypeWarning, "FolderKept", "Delete",
				"folder %s kept: it holds %d VM(s) and %d other item(s) Quartermaster did not create: %s",
				folder.Path, len(after.VMs), after.Others, strings.Join(left, ", "))
		}
	}
	res, released, err := dropRuleAndRelease()
	if released {
		r.work.forget(key)
	}
	return res, released, err
}

// release drops the finalizer.
func (r *Reconciler) release(ctx context.Context, vg *computev1alpha1.VmGroup) (reconcile.Result, bool, error) {
	orig := vg.DeepCopy()
	controllerutil.RemoveFinalizer(vg, Finalizer)
	if err := r.Client.Patch(ctx, vg, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return reconcile.Result{}, false, client.IgnoreNotFound(err)
	}
	r.addressBook().forget(client.ObjectKeyFromObject(vg)) // its addresses go with it
	return reconcile.Result{}, true, nil
}
