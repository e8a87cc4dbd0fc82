package iam

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
)

// +kubebuilder:rbac:groups=iam.quartermaster.dev,resources=iamserviceaccounts,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=iam.quartermaster.dev,resources=iamserviceaccounts/status,verbs=get;patch
// +kubebuilder:rbac:groups=iam.quartermaster.dev,resources=iamserviceaccounts/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;create;patch

// defaultMaxSessionDuration is AWS's default for a role, in seconds.
const defaultMaxSessionDuration = 3600

// ServiceAccountReconciler keeps each IAMServiceAccount's role in AWS, its attachments and its
// ServiceAccount's annotation as the spec says.
type ServiceAccountReconciler struct {
	*base
}

func (r *ServiceAccountReconciler) setupWithManager(mgr ctrl.Manager) error {
	return builder.ControllerManagedBy(mgr).
		Named("iamserviceaccount").
		For(&iamv1alpha1.IAMServiceAccount{}, builder.WithPredicates(specOrDeletion())).
		// A policy that gets (or changes) its ARN must be attached by the roles that name it.
		Watches(&iamv1alpha1.IAMPolicy{}, handler.EnqueueRequestsFromMapFunc(r.usersOfPolicy),
			builder.WithPredicates(arnChanged())).
		// An owner whose member list on the shared role changed (its status says so once the role's
		// tags are written) wakes this cluster's other objects naming the role: a member it dropped
		// is SharedRoleNotListed at once, one it added joins, instead of at their next resync.
		Watches(&iamv1alpha1.IAMServiceAccount{}, handler.EnqueueRequestsFromMapFunc(r.othersSharing),
			builder.WithPredicates(sharedMembersChanged())).
		WithOptions(r.controllerOptions()).
		Complete(r)
}

func arnChanged() predicate.Predicate {
	return updatesOnly(func(old, new client.Object) bool {
		o, okO := old.(*iamv1alpha1.IAMPolicy)
		n, okN := new.(*iamv1alpha1.IAMPolicy)
		return okO && okN && o.Status.ARN != n.Status.ARN
	})
}

// updatesOnly passes the updates changed says matter, and no creation, deletion or generic event.
func updatesOnly(changed func(old, new client.Object) bool) predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc:  func(e event.UpdateEvent) bool { return changed(e.ObjectOld, e.ObjectNew) },
	}
}

func (r *ServiceAccountReconciler) usersOfPolicy(ctx context.Context, obj client.Object) []reconcile.Request {
	list := &iamv1alpha1.IAMServiceAccountList{}
	if err := r.client.List(ctx, list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{indexPolicies: obj.GetName()}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, sa := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sa)})
	}
	return reqs
}

// Reconcile brings one IAMServiceAccount's role to its spec, or deletes it.
func (r *ServiceAccountReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	sa := &iamv1alpha1.IAMServiceAccount{}
	if err := r.client.Get(ctx, req.NamespacedName, sa); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return r.reconcileObject(ctx, sa, status.Reported{Conditions: &sa.Status.Conditions, ObservedGeneration: &sa.Status.ObservedGeneration},
		func() (status.Outcome, bool) { return r.delete(ctx, sa) },
		func() status.Outcome { return r.sync(ctx, sa) })
}

// desiredPolicies resolves spec.policies to ARNs; the names whose IAMPolicy has no ARN yet are
// returned as pending.
func (r *ServiceAccountReconciler) desiredPolicies(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount) (arns, pending []string, err error) {
	arns = slices.Clone(sa.Spec.ManagedPolicyArns)
	for _, name := range sa.Spec.Policies {
		p := &iamv1alpha1.IAMPolicy{}
		err := r.client.Get(ctx, client.ObjectKey{Namespace: sa.Namespace, Name: name}, p)
		if client.IgnoreNotFound(err) != nil {
			return nil, nil, err
		}
		if err != nil || p.Status.ARN == "" {
			pending = append(pending, name)
			continue
		}
		// The status says the policy exists; the ARN attached is the one derived from its name.
		arn, err := r.expectedPolicyARN(ctx, p)
		if err != nil {
			return nil, nil, err
		}
		if p.Status.ARN != arn {
			pending = append(pending, name)
			continue
		}
		arns = append(arns, arn)
	}
	slices.Sort(arns)
	return slices.Compact(arns), pending, nil
}

// sync creates or repairs the role, its attachments and the ServiceAccount's annotation.
func (r *ServiceAccountReconciler) sync(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount) status.Outcome {
	var notAllowed []string
	for _, arn := range sa.Spec.ManagedPolicyArns {
		if !r.cfg.allowed.Allows(arn) {
			notAllowed = append(notAllowed, arn)
		}
	}
	var ch changes
	// Refused ARNs are left out, so a role keeps being repaired and an ARN the operator stops
	// allowing is detached; the object then stalls until its spec or the flag changes.
	o := r.apply(ctx, sa, notAllowed, &ch)
	if o.Ready && !isMember(sa) { // a member does not write the role's permissions: its owner reports on them
		if poll := r.reportAccess(ctx, sa, ch.roleCreated); poll > 0 && (o.RequeueAfter == 0 || poll < o.RequeueAfter) {
			o.RequeueAfter = poll // IAM's last-accessed job runs: look at it again soon
		}
	}
	if isShared(sa) && ch.trustWritten && o.Ready && (o.RequeueAfter == 0 || o.RequeueAfter > r.sharedSettle) {
		o.RequeueAfter = r.sharedSettle // a write from an older read can still drop this member's statements: look again
	}
	if len(notAllowed) > 0 && o.Ready {
		allowed := r.cfg.allowed.String()
		if allowed == "" {
			allowed = "none"
		}
		o = status.WaitsForPerson(ReasonPolicyNotAllowed, fmt.Sprintf(
			"managedPolicyArns not allowed by the operator (--allowed-policy-arns: %s), not attached: %s", allowed, strings.Join(notAllowed, ", ")), o.RequeueAfter)
	}
	if len(ch.notes) > 0 {
		reason := "RoleUpdated"
		if ch.created {
			reason = "RoleCreated"
		}
		r.recorder.Eventf(sa, nil, corev1.EventTypeNormal, reason, "Reconcile", "%s", strings.Join(ch.notes, "; "))
		if o.Ready {
			o = o.Silenced() // a problem still gets its own Event
		}
	}
	return o
}

// changes collects what one reconcile changed, for one Event at its end (not one per step: Events
// were most of the API writes).
type changes struct {
	created bool
	notes   []string
	// roleCreated is when the role was created (IAM's CreateDate), as read on the way.
	roleCreated time.Time
	// trustWritten: the role's trust policy was written (a shared role's is read again later).
	trustWritten bool
}

func (c *changes) add(format string, args ...any) {
	c.notes = append(c.notes, fmt.Sprintf(format, args...))
}

// apply creates or repairs the role, its attachments and the parts through which pods get it (the
// ServiceAccount's annotation, the Pod Identity association), noting changes in ch. The parts
// change in the order irsa.Plan gives, so that pods never lack credentials.
func (r *ServiceAccountReconciler) apply(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, refused []string, ch *changes) status.Outcome {
	// The ServiceAccount says which parts are in place (nil: none; it does not exist or was not
	// read), so the plan is known before any AWS call.
	k8sSA, waiting := r.readServiceAccount(ctx, sa)
	plan := irsa.Plan(sa.Spec.Mechanism, r.parts(sa, k8sSA))
	// A role that must trust the OIDC provider (the mechanism's, or the annotation still in place
	// during a change away from IRSA) stalls without --oidc-issuer, before the wait for the
	// ServiceAccount, as a mechanism that needs the issuer always did.
	if o := r.withoutIssuer(sa, plan.Trust); o != nil {
		return *o
	}
	// A ServiceAccount to annotate must exist first: waiting for it costs one API read, no IAM call.
	if waiting != nil {
		return *waiting
	}
	desired, pending, err := r.desiredPolicies(ctx, sa)
	if err != nil {
		return status.Transient(ReasonAWSError, err.Error(), err)
	}
	desired = slices.DeleteFunc(desired, func(arn string) bool { return slices.Contains(refused, arn) })
	role, o := r.ensureRole(ctx, sa, plan.Trust, ch)
	if role == nil {
		return o
	}
	sa.Status.RoleName, sa.Status.RoleARN = role.Name, role.ARN
	ch.roleCreated = role.Created
	if !isMember(sa) { // a shared role's permissions are its owner's to write
		if o := r.ensureAttachments(ctx, sa, role.Name, desired, ch); o != nil {
			return *o
		}
		if o := r.ensureInline(ctx, sa, role.Name, ch); o != nil {
			return *o
		}
	}
	// What the mechanism needs is made (or confirmed) first…
	want := irsa.Needs(sa.Spec.Mechanism)
	if want.Association {
		if o := r.ensureAssociation(ctx, sa, role.ARN, ch); o != nil {
			return *o
		}
	}
	if o := r.ensureServiceAccount(ctx, sa, k8sSA, role.ARN, want.Annotation, ch); o != nil {
		return *o
	}
	// …then what it no longer needs is removed, and only then does the role stop trusting it.
	if plan.Remove.Annotation {
		if err := r.removeAnnotation(ctx, sa, k8sSA); err != nil {
			return status.Transient(ReasonAWSError, "removing the role annotation from ServiceAccount "+k8sSA.Name+": "+err.Error(), err)
		}
		ch.add("removed the role annotation from ServiceAccount %s", k8sSA.Name)
	}
	if plan.Remove.Association {
		if o := r.removeAssociation(ctx, sa, ch); o != nil {
			return *o
		}
	}
	if narrowed, err := r.ensureTrust(ctx, sa, role, plan.FinalTrust); err != nil {
		return r.roleFailure(sa, err)
	} else if narrowed {
		ch.trustWritten = true
		ch.add("IAM role %s: trust policy narrowed to the %s", role.ARN, plan.FinalTrust.Trusted())
	}
	note := ""
	if isShared(sa) {
		r.observeShared(sa, role)
		note = sharedReadyNote(sa)
	}
	if isMember(sa) {
		return synced(fmt.Sprintf("shared role %s, %s", role.ARN, describeParts(sa, want))+note, r.cfg.resync)
	}
	if want.Association {
		var o *status.Outcome
		if note, o = r.checkTarget(ctx, sa, role.ARN); o != nil {
			return *o
		}
	}
	if len(pending) > 0 {
		// The policies' ARNs trigger a reconcile when they appear; the resync still repairs drift.
		return status.Progressing(ReasonPolicyNotReady, fmt.Sprintf(
			"role %s is ready; waiting for IAMPolicy %s to exist in AWS", role.ARN, strings.Join(pending, ", ")), wait.Jitter(r.cfg.resync, 0.1))
	}
	return synced(fmt.Sprintf("role %s with %d policies, %s", role.ARN, len(desired), describeParts(sa, want))+note, r.cfg.resync)
}

// withoutIssuer stalls an object whose role would have to trust the mechanisms in trust when one
// of them needs --oidc-issuer and it is not set. Nothing is created or changed in AWS for it: a
// role whose trust policy left IRSA out would fail the pods that use the annotation.
func (r *ServiceAccountReconciler) withoutIssuer(sa *iamv1alpha1.IAMServiceAccount, trust irsa.Parts) *status.Outcome {
	if r.cfg.issuer != "" || !trust.NeedsIssuer() {
		return nil
	}
	const set = "--oidc-issuer is not set (chart value iam.oidcIssuer): set it to the cluster's OIDC issuer URL"
	var msg string
	if m := sa.Spec.Mechanism; irsa.Needs(m).NeedsIssuer() {
		if m == "" {
			m = iamv1alpha1.MechanismIRSA
		}
		msg = fmt.Sprintf("mechanism %s needs the cluster's OIDC provider in the role's trust policy and %s, or use mechanism PodIdentity; nothing is created or changed in AWS for this object until then", m, set)
	} else {
		msg = fmt.Sprintf("ServiceAccount %s still has this object's IRSA annotation, so the role must keep trusting the cluster's OIDC provider until it is removed, and %s, or remove the annotation %s (pods using it lose their credentials)",
			sa.Spec.ServiceAccountName, set, iamv1alpha1.AnnotationRoleARN)
	}
	return ptr.To(status.WaitsForPerson(ReasonOIDCIssuerNotSet, msg, r.SlowRetry))
}

// parts are the parts the IAMServiceAccount has in place: the annotation when it set it on the
// ServiceAccount (as read), the association while its record exists.
func (r *ServiceAccountReconciler) parts(sa *iamv1alpha1.IAMServiceAccount, k8sSA *corev1.ServiceAccount) irsa.Parts {
	return irsa.Parts{
		Annotation:  k8sSA != nil && k8sSA.Annotations[AnnotationOwner] == sa.Name && k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN] != "",
		Association: sa.Status.PodIdentityAssociation != nil,
	}
}

// describeParts says, for the Ready message, how pods get the role.
func describeParts(sa *iamv1alpha1.IAMServiceAccount, p irsa.Parts) string {
	var via []string
	if p.Annotation {
		via = append(via, "IRSA (ServiceAccount "+sa.Spec.ServiceAccountName+" annotated)")
	}
	if rec := sa.Status.PodIdentityAssociation; p.Association && rec != nil {
		via = append(via, "EKS Pod Identity (association "+rec.AssociationID+" in cluster "+rec.ClusterName+")")
	}
	return "served through " + strings.Join(via, " and ")
}

// trustPolicy is the trust policy of the ServiceAccount's role admitting the mechanisms in trust:
// the whole document for a role of its own; for a shared role, current (the policy IAM holds, ""
// for a role not made yet) with this member's statements in it.
func (r *ServiceAccountReconciler) trustPolicy(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, current string, trust irsa.Parts) (string, error) {
	if isShared(sa) {
		t, err := r.memberTrust(ctx, sa, nil)
		if err != nil {
			return "", err
		}
		return irsa.MergeShared(current, t, trust)
	}
	account, err := r.accountID(ctx)
	if err != nil {
		return "", err
	}
	return irsa.TrustPolicy(r.cfg.partition, account, r.cfg.issuer, sa.Namespace, sa.Spec.ServiceAccountName, trust), nil
}

// ensureTrust makes the role's trust policy admit exactly the mechanisms in trust (of a shared
// role: this member's statements, ensureSharedTrust), writing it only when it differs in meaning,
// and says whether it wrote. role.TrustPolicy is kept as written, so that the narrowing at the end
// of a change compares with what IAM now holds.
func (r *ServiceAccountReconciler) ensureTrust(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, role *awsiam.Role, trust irsa.Parts) (bool, error) {
	if isShared(sa) {
		return r.ensureSharedTrust(ctx, sa, role, trust)
	}
	doc, err := r.trustPolicy(ctx, sa, "", trust)
	if err != nil {
		return false, err
	}
	if same, err := irsa.Equivalent(role.TrustPolicy, doc); err == nil && same {
		return false, nil
	}
	if err := r.aws.UpdateTrustPolicy(ctx, role.Name, doc); err != nil {
		return false, err
	}
	role.TrustPolicy = doc
	return true, nil
}

// ensureRole gets or creates the role and repairs its trust policy (to admit the mechanisms in
// trusted), description, session duration and boundary. A nil role comes with the outcome that
// stopped it.
func (r *ServiceAccountReconciler) ensureRole(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, trusted irsa.Parts, ch *changes) (*awsiam.Role, status.Outcome) {
	trust, err := r.trustPolicy(ctx, sa, "", trusted)
	if err != nil {
		return nil, awsFailure(err, r.SlowRetry)
	}
	want := r.desiredRole(sa, trust)
	sa.Status.RoleName = want.Name
	role, err := r.aws.GetRole(ctx, want.Name)
	if awsiam.IsNotFound(err) && isShared(sa) {
		if o := r.sharedNamespace(sa); o != nil {
			return nil, *o
		}
	}
	if awsiam.IsNotFound(err) && isMember(sa) {
		return nil, status.Progressing(ReasonSharedRoleNotFound, fmt.Sprintf(
			"shared role %s does not exist yet: its owner (the IAMServiceAccount with sharedRole.owner: true, in any cluster) creates it", want.Name), r.WaitRetry)
	}
	if awsiam.IsNotFound(err) {
		role, err = r.aws.CreateRole(ctx, want)
		if awsiam.IsAlreadyExists(err) {
			// IAM is eventually consistent: look again before calling it someone else's.
			role, err = r.aws.GetRole(ctx, want.Name)
		} else if err == nil {
			ch.created = true
			ch.add("created IAM role %s", role.ARN)
			return role, status.Outcome{}
		}
	}
	if err != nil {
		return nil, awsFailure(err, r.SlowRetry)
	}
	if isShared(sa) {
		if o := r.sharedOwnership(ctx, sa, role, ch); o != nil {
			return nil, *o
		}
	} else if !irsa.OwnedBy(role.Tags, r.cfg.cluster, sa.Namespace, sa.Name) {
		if !irsa.TaggedByQuartermaster(role.Tags) && sa.Annotations[iamv1alpha1.AnnotationAdopt] != "" {
			if o := r.foreignInline(ctx, want.Name); o != nil {
				return nil, *o
			}
		}
		adopted, o := r.adopt(sa, "IAM role "+want.Name, role.Tags, func(tags awsiam.Tags) error { return r.aws.TagRole(ctx, want.Name, tags) })
		if !adopted {
			return nil, o
		}
		ch.add("adopted IAM role %s", role.ARN)
	}
	repaired, err := r.repairRole(ctx, sa, role, want, trusted)
	if err != nil {
		return nil, r.roleFailure(sa, err)
	}
	if len(repaired) > 0 {
		ch.add("IAM role %s: set %s", role.ARN, strings.Join(repaired, ", "))
		ch.trustWritten = slices.Contains(repaired, "trust policy")
	}
	return role, status.Outcome{}
}

// desiredRole is the ServiceAccount's role as the spec and the flags say, with trust policy trust.
func (r *ServiceAccountReconciler) desiredRole(sa *iamv1alpha1.IAMServiceAccount, trust string) awsiam.NewRole {
	maxSession := int32(defaultMaxSessionDuration)
	if sa.Spec.MaxSessionDuration != nil {
		maxSession = *sa.Spec.MaxSessionDuration
	}
	boundary := sa.Spec.PermissionsBoundaryArn
	if r.cfg.boundary != "" {
		boundary = r.cfg.boundary
	}
	role := awsiam.NewRole{
		Name: roleName(sa), Path: irsa.Path(r.cfg.cluster),
		Description: irsa.RoleDescription(sa.Spec.Mechanism, sa.Namespace, sa.Spec.ServiceAccountName), TrustPolicy: trust,
		MaxSessionDuration: maxSession, PermissionsBoundaryARN: boundary,
		Tags: irsa.Tags(r.cfg.cluster, sa.Namespace, sa.Name),
	}
	if isShared(sa) {
		role.Path = irsa.SharedPath
		role.Description = irsa.SharedRoleDescription(r.member(sa))
		role.Tags[irsa.TagSharedRole] = sa.Spec.SharedRole.Name
		if members, err := ownerMembers(sa); err == nil {
			maps.Copy(role.Tags, irsa.MemberTags(members))
		}
	}
	return role
}

// repairRole writes what differs between the role as read and want (its trust policy admitting
// trusted) and names what it set. Each setting is compared with what IAM answers, so a role that is
// right is not written; a mechanism change rewrites the description once.
func (r *ServiceAccountReconciler) repairRole(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, role *awsiam.Role, want awsiam.NewRole, trusted irsa.Parts) ([]string, error) {
	var repaired []string
	if set, err := r.ensureTrust(ctx, sa, role, trusted); err != nil {
		return nil, err
	} else if set {
		repaired = append(repaired, "trust policy")
	}
	if isMember(sa) {
		return repaired, nil // the rest is the owner's to write
	}
	// One UpdateRole sets both the description and the session duration.
	var settings []string
	if role.Description != want.Description {
		settings = append(settings, "description")
	}
	if role.MaxSessionDuration != want.MaxSessionDuration {
		settings = append(settings, "max session duration")
	}
	if len(settings) > 0 {
		if err := r.aws.UpdateRole(ctx, role.Name, want.Description, want.MaxSessionDuration); err != nil {
			return nil, err
		}
		repaired = append(repaired, settings...)
	}
	if role.PermissionsBoundaryARN != want.PermissionsBoundaryARN {
		var err error
		if want.PermissionsBoundaryARN == "" {
			err = r.aws.DeletePermissionsBoundary(ctx, role.Name)
		} else {
			err = r.aws.PutPermissionsBoundary(ctx, role.Name, want.PermissionsBoundaryARN)
		}
		if err != nil {
			return nil, err
		}
		repaired = append(repaired, "permissions boundary")
	}
	return repaired, nil
}

// ensureAttachments attaches and detaches only the difference between the role's policies and
// the desired ones.
func (r *ServiceAccountReconciler) ensureAttachments(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, role string, desired []string, ch *changes) *status.Outcome {
	current, err := r.aws.ListAttachedPolicies(ctx, role)
	if err != nil {
		o := awsFailure(err, r.SlowRetry)
		if awsiam.IsNotFound(err) {
			o = propagating(err) // the role was just created or read
		}
		return &o
	}
	attach, detach := irsa.AttachmentDiff(current, desired)
	for _, arn := range detach {
		if err := r.aws.DetachPolicy(ctx, role, arn); err != nil && !awsiam.IsNotFound(err) {
			o := awsFailure(err, r.SlowRetry)
			return &o
		}
	}
	for _, arn := range attach {
		if err := r.aws.AttachPolicy(ctx, role, arn); err != nil {
			o := awsFailure(err, r.SlowRetry)
			if awsiam.IsNotFound(err) && !slices.Contains(sa.Spec.ManagedPolicyArns, arn) {
				// One of our IAMPolicies, which IAM has just said exists: not yet everywhere in IAM.
				o = propagating(err)
			}
			return &o
		}
	}
	if len(attach)+len(detach) > 0 {
		ch.add("attached %d and detached %d policies", len(attach), len(detach))
	}
	sa.Status.AttachedPolicyArns = desired
	return nil
}

// readServiceAccount reads the ServiceAccount (nil when it does not exist yet). One to annotate
// that does not exist is an outcome: waiting for it costs this one read, and no IAM call.
// ServiceAccounts are read from the API server: the shared cache may be narrowed to another
// controller's ServiceAccounts.
func (r *ServiceAccountReconciler) readServiceAccount(ctx context.Context, iamsa *iamv1alpha1.IAMServiceAccount) (*corev1.ServiceAccount, *status.Outcome) {
	sa := &corev1.ServiceAccount{}
	err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: iamsa.Namespace, Name: iamsa.Spec.ServiceAccountName}, sa)
	switch {
	case err == nil:
		return sa, nil
	case !apierrors.IsNotFound(err):
		return nil, ptr.To(status.Transient(ReasonAWSError, err.Error(), err))
	case iamsa.Spec.CreateServiceAccount:
		return nil, nil
	default:
		return nil, ptr.To(status.Progressing(ReasonServiceAccountNotFound, fmt.Sprintf(
			"ServiceAccount %s does not exist (create it, or set spec.createServiceAccount); the role is made when it does", iamsa.Spec.ServiceAccountName), r.WaitRetry))
	}
}

// AnnotationOwner on a ServiceAccount names the IAMServiceAccount that set its role annotation,
// so the annotation is only ever changed or removed by its owner.
const AnnotationOwner = "iam.quartermaster.dev/iamserviceaccount"

// ensureServiceAccount creates (createServiceAccount) the ServiceAccount, as read by
// readServiceAccount (nil: it does not exist), and, when annotate (the mechanism includes IRSA),
// annotates it with the role's ARN.
func (r *ServiceAccountReconciler) ensureServiceAccount(ctx context.Context, iamsa *iamv1alpha1.IAMServiceAccount, sa *corev1.ServiceAccount, roleARN string, annotate bool, ch *changes) *status.Outcome {
	key := client.ObjectKey{Namespace: iamsa.Namespace, Name: iamsa.Spec.ServiceAccountName}
	if sa == nil {
		sa = &corev1.ServiceAccount{}
		sa.Namespace, sa.Name = key.Namespace, key.Name
		if annotate {
			sa.Annotations = map[string]string{iamv1alpha1.AnnotationRoleARN: roleARN, AnnotationOwner: iamsa.Name}
		}
		if err := controllerutil.SetControllerReference(iamsa, sa, r.client.Scheme()); err != nil {
			return ptr.To(status.Transient(ReasonAWSError, err.Error(), err))
		}
		if err := r.client.Create(ctx, sa); apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			// The namespace is going, and this object with it: nothing to create, nothing to retry fast.
			return ptr.To(status.Progressing(ReasonServiceAccountNotFound, "namespace "+key.Namespace+" is being deleted", r.WaitRetry))
		} else if apierrors.IsAlreadyExists(err) {
			return ptr.To(status.Transient(ReasonServiceAccountConflict, "creating ServiceAccount "+key.Name+": "+err.Error(), err))
		} else if err != nil {
			return ptr.To(status.Transient(ReasonAWSError, "creating ServiceAccount "+key.Name+": "+err.Error(), err))
		}
		ch.add("created ServiceAccount %s", key.Name)
		return nil
	}
	if iamsa.Spec.CreateServiceAccount && !metav1.IsControlledBy(sa, iamsa) {
		return ptr.To(status.WaitsForPerson(ReasonServiceAccountConflict, fmt.Sprintf(
			"ServiceAccount %s exists and was not created by this IAMServiceAccount; set createServiceAccount: false to annotate it", key.Name), r.SlowRetry))
	}
	if !annotate {
		return nil
	}
	current, owner := sa.Annotations[iamv1alpha1.AnnotationRoleARN], sa.Annotations[AnnotationOwner]
	if current == roleARN && owner == iamsa.Name {
		return nil
	}
	if current != "" && current != roleARN && owner != iamsa.Name {
		return ptr.To(status.WaitsForPerson(ReasonServiceAccountConflict, fmt.Sprintf(
			"ServiceAccount %s is already annotated %s=%s by someone else; remove the annotation to let this IAMServiceAccount set it",
			key.Name, iamv1alpha1.AnnotationRoleARN, current), r.SlowRetry))
	}
	orig := sa.DeepCopy()
	if sa.Annotations == nil {
		sa.Annotations = map[string]string{}
	}
	sa.Annotations[iamv1alpha1.AnnotationRoleARN], sa.Annotations[AnnotationOwner] = roleARN, iamsa.Name
	if err := r.client.Patch(ctx, sa, client.MergeFrom(orig)); err != nil {
		return ptr.To(status.Transient(ReasonAWSError, "annotating ServiceAccount "+key.Name+": "+err.Error(), err))
	}
	ch.add("annotated ServiceAccount %s", key.Name)
	return nil
}

// delete removes the Pod Identity association and the role (detached first) unless retained, and
// the ServiceAccount's annotation, then releases the object.
func (r *ServiceAccountReconciler) delete(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount) (status.Outcome, bool) {
	if !controllerutil.ContainsFinalizer(sa, Finalizer) {
		return status.Outcome{}, true
	}
	if sa.Annotations[iamv1alpha1.AnnotationDeletionPolicy] == iamv1alpha1.DeletionPolicyRetain {
		// The role stays, so the ServiceAccount keeps pointing at it, and a created one is orphaned
		// rather than garbage-collected.
		if err := r.orphanServiceAccount(ctx, sa); err != nil {
			return status.Transient(ReasonDeleting, err.Error(), err), false
		}
		r.recorder.Eventf(sa, nil, corev1.EventTypeNormal, "Retained", "Delete", "IAM role %s kept in AWS (deletion-policy: retain)", sa.Status.RoleARN)
		return r.release(ctx, sa)
	}
	var ch changes
	if o := r.removeAssociation(ctx, sa, &ch); o != nil {
		return *o, false
	}
	if len(ch.notes) > 0 {
		r.recorder.Eventf(sa, nil, corev1.EventTypeNormal, "AssociationDeleted", "Delete", "%s", strings.Join(ch.notes, "; "))
	}
	if isShared(sa) {
		if o := r.deleteShared(ctx, sa); o != nil {
			return *o, false
		}
	} else if o := r.deleteOwnRole(ctx, sa); o != nil {
		return *o, false
	}
	if err := r.removeAnnotation(ctx, sa, nil); err != nil {
		return status.Transient(ReasonDeleting, err.Error(), err), false
	}
	return r.release(ctx, sa)
}

// deleteOwnRole deletes the object's own role (detached first) when it is tagged as the object's.
func (r *ServiceAccountReconciler) deleteOwnRole(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount) *status.Outcome {
	name := irsa.RoleName(sa.Namespace, sa.Spec.ServiceAccountName)
	role, err := r.aws.GetRole(ctx, name)
	switch {
	case awsiam.IsNotFound(err):
	case err != nil:
		return ptr.To(awsFailure(err, r.SlowRetry))
	case !irsa.OwnedBy(role.Tags, r.cfg.cluster, sa.Namespace, sa.Name):
		r.recorder.Eventf(sa, nil, corev1.EventTypeWarning, ReasonConflict, "Delete", "IAM role %s is not tagged as this object's; left in AWS", name)
	default:
		ours := slices.Clone(sa.Status.InlinePolicies)
		for _, p := range sa.Spec.InlinePolicies {
			ours = append(ours, p.Name) // put by a step whose status was not written, maybe
		}
		if sa.Spec.TargetRoleArn != "" {
			ours = append(ours, targetPolicyName)
		}
		if o := r.deleteRole(ctx, name, ours); o != nil {
			return o
		}
		r.recorder.Eventf(sa, nil, corev1.EventTypeNormal, "RoleDeleted", "Delete", "deleted IAM role %s", role.ARN)
	}
	return nil
}

// deleteRole detaches every policy and deletes the inline policies named in ours (IAM refuses to
// delete a role with either), then deletes the role; what is already gone is fine, so an
// interrupted deletion resumes. Inline policies someone else put stay, and IAM's DeleteConflict
// says so (Stalled, as does a role in an instance profile).
func (r *ServiceAccountReconciler) deleteRole(ctx context.Context, name string, ours []string) *status.Outcome {
	err := r.detachAndDelete(ctx, name, ours)
	switch {
	case awsiam.IsConflict(err):
		return ptr.To(status.WaitsForPerson("DeleteConflict", awsiam.StatusMessage(err)+
			" (someone added an inline policy or an instance profile to the role: remove it, or set the retain annotation)", r.SlowRetry))
	case err != nil:
		return ptr.To(awsFailure(err, r.SlowRetry))
	}
	return nil
}

// detachAndDelete is deleteRole's AWS calls.
func (r *ServiceAccountReconciler) detachAndDelete(ctx context.Context, name string, ours []string) error {
	attached, err := r.aws.ListAttachedPolicies(ctx, name)
	if err != nil {
		return err
	}
	if len(ours) > 0 {
		inline, err := r.aws.ListInlinePolicies(ctx, name)
		if err != nil && !awsiam.IsNotFound(err) {
			return err
		}
		for _, p := range inline {
			if slices.Contains(ours, p) {
				if err := r.aws.DeleteInlinePolicy(ctx, name, p); err != nil && !awsiam.IsNotFound(err) {
					return err
				}
			}
		}
	}
	for _, arn := range attached {
		if err := r.aws.DetachPolicy(ctx, name, arn); err != nil && !awsiam.IsNotFound(err) {
			return err
		}
	}
	if err := r.aws.DeleteRole(ctx, name); err != nil && !awsiam.IsNotFound(err) {
		return err
	}
	return nil
}

// removeAnnotation takes the role annotation off the ServiceAccount (as read, or read now when
// nil) when this object set it.
func (r *ServiceAccountReconciler) removeAnnotation(ctx context.Context, iamsa *iamv1alpha1.IAMServiceAccount, sa *corev1.ServiceAccount) error {
	if sa == nil {
		sa = &corev1.ServiceAccount{}
		if err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: iamsa.Namespace, Name: iamsa.Spec.ServiceAccountName}, sa); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	if sa.Annotations[AnnotationOwner] != iamsa.Name {
		return nil
	}
	orig := sa.DeepCopy()
	delete(sa.Annotations, iamv1alpha1.AnnotationRoleARN)
	delete(sa.Annotations, AnnotationOwner)
	return client.IgnoreNotFound(r.client.Patch(ctx, sa, client.MergeFrom(orig)))
}

// orphanServiceAccount drops this object's ownerReference from the ServiceAccount it created.
func (r *ServiceAccountReconciler) orphanServiceAccount(ctx context.Context, iamsa *iamv1alpha1.IAMServiceAccount) error {
	sa := &corev1.ServiceAccount{}
	err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: iamsa.Namespace, Name: iamsa.Spec.ServiceAccountName}, sa)
	if err != nil || !metav1.IsControlledBy(sa, iamsa) {
		return client.IgnoreNotFound(err)
	}
	orig := sa.DeepCopy()
	sa.OwnerReferences = slices.DeleteFunc(sa.OwnerReferences, func(ref metav1.OwnerReference) bool { return ref.UID == iamsa.UID })
	return client.IgnoreNotFound(r.client.Patch(ctx, sa, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})))
}

func (r *ServiceAccountReconciler) release(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount) (status.Outcome, bool) {
	if err := r.patchFinalizer(ctx, sa, false); err != nil {
		return status.Transient(ReasonDeleting, err.Error(), err), false
	}
	return status.Outcome{}, true
}
