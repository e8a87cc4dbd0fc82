package vmgroups

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// +kubebuilder:rbac:groups=compute.quartermaster.dev,resources=vmgroups,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=compute.quartermaster.dev,resources=vmgroups/status,verbs=get;patch
// +kubebuilder:rbac:groups=compute.quartermaster.dev,resources=vmgroups/finalizers,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// The vCenter Secret is cached and watched (by name) in the operator's namespace only; if
// --vsphere-secret names another namespace, move the Role there.
// +kubebuilder:rbac:groups="",namespace=quartermaster-system,resources=secrets,verbs=get;list;watch

// Finalizer holds a VmGroup until its VMs and folder are gone.
const Finalizer = "compute.quartermaster.dev/vms"

const (
	reconcileTimeout = 10 * time.Minute
	// defaultShutdownTimeout is spec.shutdownTimeout's default, for objects written before it had one.
	defaultShutdownTimeout = time.Minute
)

// SelectorLabel is the label key of the scale subresource's selector.
const SelectorLabel = "compute.quartermaster.dev/vmgroup"

// Reconciler keeps VmGroups' VMs in vCenter as their specs say.
type Reconciler struct {
	Client    client.Client
	Secrets   client.Reader // reads the vCenter Secret: a cache holding that Secret alone
	Recorder  events.EventRecorder
	Connector *vcenter.Connector
	Secret    types.NamespacedName
	Insecure  bool
	Defaults  vcenter.Placement
	// CloneConcurrency bounds the clones running at once across all groups, and the clones of one
	// reconcile.
	CloneConcurrency int
	// Resync is the drift check period (jittered).
	Resync time.Duration
	// SlowRetry is how often a problem only a person can fix (missing template, Secret or
	// placement) is checked again.
	SlowRetry time.Duration
	// GuestPoll is how often a group whose VMs wait for their guests' addresses looks again.
	GuestPoll time.Duration
	// MaxReplicas is the most VMs one group may ask for; a group asking more stalls, cloning none.
	MaxReplicas int
	// Reader reads the Secrets of groups' user data, uncached.
	Reader client.Reader

	secrets   cache.Cache // Secrets' cache, watched; nil when Secrets is another reader
	clones    chan struct{}
	slotsOnce sync.Once
	addrs     *addressBook
	addrOnce  sync.Once
	work      *background
}

// NewReconciler builds the reconciler from the options.
func NewReconciler(mgr ctrl.Manager, o *Options) (*Reconciler, error) {
	if _, _, err := mgr.GetScheme().ObjectKinds(&computev1alpha1.VmGroup{}); err != nil {
		return nil, errors.New("the manager's scheme lacks compute.quartermaster.dev/v1alpha1 (add computev1alpha1.AddToScheme)")
	}
	ref, err := o.secretRef()
	if err != nil {
		return nil, err
	}
	secrets, err := newSecretCache(mgr, ref)
	if err != nil {
		return nil, err
	}
	return &Reconciler{
		// The status drives decisions (the folder path, the Ready reason's Event): never read a
		// VmGroup older than the last write of it.
		Client:           status.NewClient(mgr.GetClient(), &computev1alpha1.VmGroup{}),
		Secrets:          secrets,
		secrets:          secrets,
		Recorder:         status.NewRecorder(mgr, "quartermaster-vmgroups"),
		Connector:        &vcenter.Connector{},
		Secret:           ref,
		Insecure:         o.Insecure,
		Defaults:         o.Defaults,
		CloneConcurrency: o.CloneConcurrency,
		Resync:           o.Resync,
		SlowRetry:        time.Minute,
		MaxReplicas:      o.MaxReplicas,
		GuestPoll:        2 * time.Second,
		Reader:           mgr.GetAPIReader(),
		work:             newBackground(),
	}, nil
}

// SetupWithManager watches VmGroups and the vCenter Secret. Only spec changes (and deletion) of a
// VmGroup trigger its reconcile: the controller's own status and finalizer writes do not. A
// change of the Secret's data triggers a reconcile of every VmGroup.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	r.cloneSlots()
	status.CountObjects(mgr, "VmGroup", &computev1alpha1.VmGroupList{}, status.ConditionState)
	deleting := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp() == nil && e.ObjectNew.GetDeletionTimestamp() != nil
	}}
	if r.work == nil {
		r.work = newBackground()
	}
	err := mgr.Add(ctrl.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		r.work.stop()       // operations in flight end (their vCenter tasks go on)
		r.Connector.Close() // then log out of vCenter
		return nil
	}))
	if err != nil {
		return err
	}
	b := builder.ControllerManagedBy(mgr).
		Named(Name).
		For(&computev1alpha1.VmGroup{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, deleting)))
	if r.secrets != nil {
		if err := controllers.AddCache(mgr, r.secrets); err != nil {
			return err
		}
		b = b.WatchesRawSource(r.secretSource())
	}
	// An operation's end wakes its group.
	b = b.WatchesRawSource(source.Channel(r.work.wake, &handler.TypedEnqueueRequestForObject[*computev1alpha1.VmGroup]{}))
	return b.
		WithOptions(controller.Options{
			MaxConcurrentReconciles: concurrency,
			// A batch of clones can take long on a real vCenter, but not forever.
			ReconciliationTimeout: reconcileTimeout,
			// vCenter errors back off from 1s to 5m (not the default 16m: the group should recover soon after vCenter does).
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Second, 5*time.Minute),
		}).
		Complete(r)
}

// Reconcile brings one VmGroup a step closer to its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (res reconcile.Result, retErr error) {
	vg := &computev1alpha1.VmGroup{}
	if err := r.Client.Get(ctx, req.NamespacedName, vg); err != nil {
		if apierrors.IsNotFound(err) {
			r.work.forget(req.NamespacedName)
			r.addressBook().forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	read := vg.DeepCopy()
	before := &read.Status
	released := false
	defer func() {
		if released {
			return // the finalizer is gone, and likely the object with it
		}
		// Once, whatever concluded (status.Step.Conclude, in report), even when the reconcile
		// ran out of time.
		if err := r.step().Write(ctx, vg, read); err != nil {
			res, retErr = reconcile.Result{}, errors.Join(retErr, err)
		}
	}()

	if !vg.DeletionTimestamp.IsZero() {
		result, done, err := r.reconcileDelete(ctx, vg)
		released = done
		return result, err
	}
	if !controllerutil.ContainsFinalizer(vg, Finalizer) {
		orig := vg.DeepCopy()
		controllerutil.AddFinalizer(vg, Finalizer)
		if err := r.Client.Patch(ctx, vg, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return reconcile.Result{}, err
		}
		vg.Status = *before.DeepCopy()
	}
	persist := func() error {
		// A copy is written: the write reads the object back, whose spec may be newer than the one
		// this reconcile acts on.
		if err := r.step().Write(ctx, vg.DeepCopy(), read); err != nil {
			return err
		}
		read = vg.DeepCopy() // the write at the end compares with what is stored now
		return nil
	}
	return r.reconcileNormal(ctx, vg, before, persist)
}

// spec is the VmGroup's spec in vCenter's units.
func spec(vg *computev1alpha1.VmGroup) vsphere.Spec {
	replicas := 1
	if vg.Spec.Replicas != nil {
		replicas = int(*vg.Spec.Replicas)
	}
	return vsphere.Spec{
		Name:        vg.Name,
		Key:         vsphere.GroupKey(vg.Namespace, vg.Name),
		Replicas:    replicas,
		CPU:         vg.Spec.CPU,
		MemoryMB:    vg.Spec.Memory * 1024,
		Template:    vg.Spec.Template,
		Linked:      vg.Spec.CloneMode == computev1alpha1.CloneModeLinked,
		Snapshot:    vg.Spec.Snapshot,
		GuestIP:     vg.Spec.Readiness != computev1alpha1.ReadinessPowerState,
		DeleteFirst: deleteFirst(vg),
		Disks:       disks(vg),
	}
}

// disks are the spec's data disks in the domain's terms.
func disks(vg *computev1alpha1.VmGroup) []vsphere.Disk {
	var out []vsphere.Disk
	for _, d := range vg.Spec.Disks {
		out = append(out, vsphere.Disk{Name: d.Name, SizeGiB: d.SizeGiB, Datastore: d.Datastore})
	}
	return out
}

// deleteFirst is the set of VM names the group's AnnotationDeleteFirst lists (nil: none).
func deleteFirst(vg *computev1alpha1.VmGroup) map[string]bool {
	var out map[string]bool
	for name := range strings.SplitSeq(vg.Annotations[computev1alpha1.AnnotationDeleteFirst], ",") {
		if name = strings.TrimSpace(name); name != "" {
			if out == nil {
				out = map[string]bool{}
			}
			out[name] = true
		}
	}
	return out
}

// notMembers are the names s.DeleteFirst lists that are no member of the group, sorted.
func notMembers(s vsphere.Spec, obs vsphere.Observation) []string {
	var out []string
	for name := range s.DeleteFirst {
		if !slices.ContainsFunc(obs.Members, func(m vsphere.Member) bool { return m.Name == name }) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// shutdownTimeout is how long a guest gets to shut down before a hard power-off.
func shutdownTimeout(vg *computev1alpha1.VmGroup) time.Duration {
	if t := vg.Spec.ShutdownTimeout; t != nil {
		return max(t.Duration, 0)
	}
	return defaultShutdownTimeout
}

// placement is the spec's placement with the operator's defaults for what it leaves empty.
func (r *Reconciler) placement(vg *computev1alpha1.VmGroup) vcenter.Placement {
	p := r.Defaults
	if sp := vg.Spec.Placement; sp != nil {
		p.Datacenter = cmp.Or(sp.Datacenter, p.Datacenter)
		p.Folder = cmp.Or(sp.Folder, p.Folder)
		p.ResourcePool = cmp.Or(sp.ResourcePool, p.ResourcePool)
		p.Datastore = cmp.Or(sp.Datastore, p.Datastore)
		p.Network = cmp.Or(sp.Network, p.Network)
	}
	return p
}

// reconcileNormal brings a group a step closer to its spec; persist writes the status at once (for
// what must be recorded before vCenter is changed).
func (r *Reconciler) reconcileNormal(ctx context.Context, vg *computev1alpha1.VmGroup, before *computev1alpha1.VmGroupStatus, persist func() error) (reconcile.Result, error) {
	key := client.ObjectKeyFromObject(vg)
	ends, running := r.work.take(key)
	g := &group{vg: vg, key: key, spec: spec(vg), placement: r.placement(vg), shutdown: shutdownTimeout(vg), about: about(vg)}
	s := &g.spec
	vg.Status.DesiredReplicas = int32(s.Replicas)
	vg.Status.Selector = SelectorLabel + "=" + vg.Name
	opErr := r.announce(vg, ends, 0)

	if r.MaxReplicas > 0 && s.Replicas > r.MaxReplicas {
		return r.fail(vg, stalled("TooManyReplicas", fmt.Sprintf(
			"spec.replicas %d is above this operator's limit of %d (its --vsphere-max-replicas flag); nothing is cloned or removed until it is at most %d",
			s.Replicas, r.MaxReplicas, r.MaxReplicas)))
	}
	pool, f := addressPool(vg)
	if f != nil {
		return r.fail(vg, f)
	}
	g.pool = pool
	boot, f := r.readBoot(ctx, vg, pool)
	if f != nil {
		return r.fail(vg, f)
	}
	if boot != nil {
		g.boot, s.Boot = boot, boot.fingerprint()
	}

	api, f := r.connect(ctx)
	if f != nil {
		return r.fail(vg, f)
	}
	g.api = api
	folder, f := r.folder(ctx, api, vg, g.placement, true)
	if f != nil {
		return r.fail(vg, f)
	}
	g.folder = folder
	vg.Status.Folder = folder.Path

	var listing vcenter.Listing
	if !folder.Created {
		var err error
		if listing, err = api.List(ctx, folder); err != nil {
			return r.fail(vg, vcenterFailure(err))
		}
	}
	obs := vsphere.Observe(*s, listing.VMs, running.Cloning)
	r.observe(vg, before, *s, obs)
	if g.pool == nil && len(vg.Status.Addresses) > 0 {
		keepAddresses(vg, obs, running) // a pool dropped: its VMs keep theirs while they last
	}

	// A failed step backs the group off by its own count (the workqueue's would restart at every
	// wake-up of an operation that ended well).
	if a := r.work.currentAffinity(key); a != nil && a.ruleExists() {
		vg.Status.AntiAffinityRule = a.name // made by an operation that ended: recorded even if it failed
	}
	if opErr != nil {
		fl := classify(opErr)
		if names := unplaced(ends); len(names) > 0 {
			fl = unplaceable(vg, names)
		}
		return r.waitOut(vg, fl, r.work.failed(key, fl, r.SlowRetry))
	}
	if fl, wait := r.work.backingOff(key); fl != nil {
		return r.waitOut(vg, fl, wait)
	}
	if len(ends) > 0 {
		r.work.succeeded(key)
	}

	note, f := r.keepApart(ctx, g, obs, running.Empty())
	if f != nil {
		return r.waitOut(vg, f, r.work.failed(key, f, r.SlowRetry))
	}

	plan := vsphere.NewPlan(*s, obs, running, r.CloneConcurrency-len(running.Cloning))
	if unknown := notMembers(*s, obs); len(plan.Delete) > 0 && len(unknown) > 0 {
		r.Recorder.Eventf(vg, nil, corev1.EventTypeWarning, "DeleteFirstIgnored", "ScaleDown",
			"%s names %s, which are not members of the group: ignored", computev1alpha1.AnnotationDeleteFirst, strings.Join(unknown, ", "))
	}
	var short []string
	if g.pool != nil {
		if short, f = r.allocate(ctx, g, &plan, obs, running, persist); f != nil {
			return r.waitOut(vg, f, r.work.failed(key, f, r.SlowRetry))
		}
	}
	if f := r.startPlan(ctx, g, plan); f != nil {
		return r.waitOut(vg, f, r.work.failed(key, f, r.SlowRetry))
	}
	if len(short) > 0 {
		f := exhausted(g, short)
		return r.waitOut(vg, f, r.work.failed(key, f, r.SlowRetry))
	}

	if plan.Settled {
		r.work.settle(key)
		o := status.Healthy("Running", fmt.Sprintf("%d/%d VMs ready", len(obs.Members), s.Replicas)+unmanagedNote(obs)+note, r.Resync)
		r.report(vg, computev1alpha1.PhaseRunning, o)
		return o.Result()
	}
	now := r.work.inFlight(key) // what ended meanwhile stays for the reconcile it woke
	reason, msg := progress(*s, obs, plan, now)
	// Each operation's end wakes the group (the resync is a safety net). Nothing tells when a
	// guest reports its address, so while only that is awaited the group looks again every
	// GuestPoll: one vCenter call per look.
	after := r.Resync
	if now.Empty() && plan.Empty() && len(plan.Waiting) > 0 {
		after = r.GuestPoll
	}
	o := status.Progressing(reason, msg+unmanagedNote(obs)+note, after).Silenced()
	r.report(vg, computev1alpha1.PhasePending, o)
	return o.Result()
}

// waitOut reports the failure and looks again after wait.
func (r *Reconciler) waitOut(vg *computev1alpha1.VmGroup, f *failure, wait time.Duration) (reconcile.Result, error) {
	o := *f
	o.Err, o.RequeueAfter = nil, wait
	return r.fail(vg, &o)
}

// progress says what a group that is not settled is doing, with the reason to show.
func progress(s vsphere.Spec, obs vsphere.Observation, plan vsphere.Plan, running vsphere.InFlight) (string, string) {
	ready := 0
	for _, m := range obs.Members {
		if m.Ready(s) {
			ready++
		}
	}
	parts := []string{fmt.Sprintf("%d/%d VMs ready", ready, s.Replicas)}
	names := func(set map[string]bool, kind string) {
		if len(set) > 0 {
			list := slices.SortedFunc(maps.Keys(set), vsphere.CompareVMNames)
			parts = append(parts, kind+" "+strings.Join(list, ", "))
		}
	}
	names(running.Cloning, "cloning")
	names(running.Busy, "changing")
	if plan.Missing > len(plan.Create) {
		parts = append(parts, fmt.Sprintf("%d more to create", plan.Missing-len(plan.Create)))
	}
	var waiting []string
	for _, m := range plan.Waiting {
		waiting = append(waiting, m.Name)
	}
	if len(waiting) > 0 {
		parts = append(parts, "waiting for the guest of "+strings.Join(waiting, ", ")+" to report an IP address (VMware Tools)")
	}
	reason := "Scaling"
	switch {
	case len(running.Cloning) > 0 || plan.Missing > 0 || len(obs.Members) > s.Replicas:
	case len(plan.PowerOn) > 0 || len(running.Busy) > 0 && !rolling(obs, s, running):
		reason = "Repairing"
	case rolling(obs, s, running):
		reason = "RollingUpdate"
	case len(waiting) > 0:
		reason = "WaitingForGuest"
	}
	return reason, strings.Join(parts, "; ")
}

// rolling reports whether a member being changed is out of date (a replacement or reconfiguration).
func rolling(obs vsphere.Observation, s vsphere.Spec, running vsphere.InFlight) bool {
	for _, m := range obs.Members {
		if running.Busy[m.Name] && !m.UpToDate(s) {
			return true
		}
	}
	return false
}

// folder finds (or with create, makes) the group's folder: the path recorded in the status when
// there is one, so later changes of the operator's defaults never lose a group's VMs.
func (r *Reconciler) folder(ctx context.Context, api vcenter.API, vg *computev1alpha1.VmGroup, p vcenter.Placement, create bool) (vcenter.Folder, *failure) {
	path := vg.Status.Folder
	if path == "" {
		var err error
		if path, err = api.FolderPath(ctx, p, vsphere.FolderName(vg.Namespace, vg.Name)); err != nil {
			return vcenter.Folder{}, classify(err)
		}
	}
	folder, err := api.Folder(ctx, path, create)
	if err != nil {
		return vcenter.Folder{}, classify(err)
	}
	if folder.Created {
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, "FolderCreated", "Create", "created folder %s", folder.Path)
	}
	return folder, nil
}

// observe records the group's VMs in the status and reports VMs that are not the group's.
func (r *Reconciler) observe(vg *computev1alpha1.VmGroup, before *computev1alpha1.VmGroupStatus, s vsphere.Spec, obs vsphere.Observation) {
	st := &vg.Status
	st.VMs = nil
	st.CurrentReplicas, st.ReadyReplicas = 0, 0
	for _, m := range obs.Members {
		ready := m.Ready(s)
		st.VMs = append(st.VMs, computev1alpha1.VMStatus{Name: m.Name, PowerState: string(m.PowerState), IP: m.IP, IPAddresses: m.IPs, Ready: ready})
		st.CurrentReplicas++
		if ready {
			st.ReadyReplicas++
		}
	}
	st.Ready = fmt.Sprintf("%d/%d", st.ReadyReplicas, s.Replicas)
	st.UnmanagedVMs = nil
	for _, vm := range obs.Unmanaged {
		st.UnmanagedVMs = append(st.UnmanagedVMs, vm.Name)
	}
	if len(st.UnmanagedVMs) > 0 && !equality.Semantic.DeepEqual(st.UnmanagedVMs, before.UnmanagedVMs) {
		r.Recorder.Eventf(vg, nil, corev1.EventTypeWarning, "UnmanagedVMs", "Observe",
			"folder %s holds VMs Quartermaster did not create; they are left alone: %s", st.Folder, strings.Join(st.UnmanagedVMs, ", "))
	}
}

func unmanagedNote(obs vsphere.Observation) string {
	if len(obs.Unmanaged) == 0 {
		return ""
	}
	names := make([]string, 0, len(obs.Unmanaged))
	for _, vm := range obs.Unmanaged {
		names = append(names, vm.Name)
	}
	return fmt.Sprintf("; %d VM(s) in the folder not created by Quartermaster, left alone: %s", len(names), strings.Join(names, ", "))
}
