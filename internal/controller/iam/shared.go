package iam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
)

// Shared roles (spec.sharedRole): the role is named by the spec, lives at irsa.SharedPath and is
// tagged irsa.TagSharedRole; its trust policy is a merge of its members' statements (irsa.MergeShared),
// each written by its own cluster's operator; one member, the owner, also carries the ownership
// tags and writes the permissions. docs/iam.md has the design.

// Reasons of a shared role.
const (
	// ReasonSharedRoleNotFound: a member waits for the role's owner to create it.
	ReasonSharedRoleNotFound = "SharedRoleNotFound"
	// ReasonSharedRoleTrustFull: the member's statement does not fit IAM's trust policy quota.
	ReasonSharedRoleTrustFull = "SharedRoleTrustFull"
	// ReasonSharedRoleNotAllowed: the object's namespace may not use shared roles
	// (--iam-shared-role-namespaces).
	ReasonSharedRoleNotAllowed = "SharedRoleNotAllowed"
	// ReasonSharedRoleNotListed: the role's owner does not list the object among its members.
	ReasonSharedRoleNotListed = "SharedRoleNotListed"
	// ReasonSharedRoleTakingOver: the object took over a role without owner and confirms it is
	// the only one before it writes the role's permissions.
	ReasonSharedRoleTakingOver = "SharedRoleTakingOver"
)

// maxTrustedBy is how many other members status.sharedRole.trustedBy lists.
const maxTrustedBy = 20

// errTrustOverwritten is a member's statements missing from the trust policy right after it wrote
// them: another operator wrote the policy from an older read. The reconcile is retried (with the
// failure backoff), reads the policy again and writes its statements into it.
var errTrustOverwritten = errors.New("another writer replaced the shared role's trust policy at the same moment; writing this member's statements again")

// isShared says whether sa uses a shared role; isMember, whether it uses one it does not own.
func isShared(sa *iamv1alpha1.IAMServiceAccount) bool { return sa.Spec.SharedRole != nil }
func isMember(sa *iamv1alpha1.IAMServiceAccount) bool {
	return sa.Spec.SharedRole != nil && !sa.Spec.SharedRole.Owner
}

// roleName is the IAM role sa's pods get: the shared role's, or its own (irsa.RoleName).
func roleName(sa *iamv1alpha1.IAMServiceAccount) string {
	if isShared(sa) {
		return sa.Spec.SharedRole.Name
	}
	return irsa.RoleName(sa.Namespace, sa.Spec.ServiceAccountName)
}

// member is sa as one of a shared role's members.
func (r *ServiceAccountReconciler) member(sa *iamv1alpha1.IAMServiceAccount) irsa.Member {
	return irsa.Member{Cluster: r.cfg.cluster, Namespace: sa.Namespace, Name: sa.Name}
}

// memberTrust is what sa's statements in a shared role's trust policy admit (role: as read; nil
// when sa is about to create it).
func (r *ServiceAccountReconciler) memberTrust(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, role *awsiam.Role) (irsa.MemberTrust, error) {
	account, err := r.accountID(ctx)
	if err != nil {
		return irsa.MemberTrust{}, err
	}
	t := irsa.MemberTrust{
		Member: r.member(sa), ServiceAccount: sa.Spec.ServiceAccountName,
		Partition: r.cfg.partition, AccountID: account, Issuer: r.cfg.issuer, EKSCluster: r.cfg.eksCluster,
	}
	// The owner's list prunes the trust policy of the role it owns (or creates: role nil), never
	// of one another object owns.
	if sa.Spec.SharedRole.Owner && (role == nil || irsa.OwnedBy(role.Tags, r.cfg.cluster, sa.Namespace, sa.Name)) {
		t.Owner = true
		if t.Listed, err = ownerMembers(sa); err != nil {
			return irsa.MemberTrust{}, err
		}
	}
	return t, nil
}

// sharedNamespace refuses an object whose namespace --iam-shared-role-namespaces leaves out.
func (r *ServiceAccountReconciler) sharedNamespace(sa *iamv1alpha1.IAMServiceAccount) *status.Outcome {
	for _, p := range r.cfg.sharedNamespaces {
		if ok, _ := path.Match(p, sa.Namespace); ok {
			return nil
		}
	}
	allowed := strings.Join(r.cfg.sharedNamespaces, ", ")
	if allowed == "" {
		allowed = "none"
	}
	return ptr.To(status.WaitsForPerson(ReasonSharedRoleNotAllowed, fmt.Sprintf(
		"this cluster's operator lets only the IAMServiceAccounts of some namespaces use shared roles (--iam-shared-role-namespaces, chart value iam.sharedRoleNamespaces: %s), and not namespace %s: ask the platform team, or use a role of this object's own (no sharedRole)",
		allowed, sa.Namespace), r.SlowRetry))
}

// ownerMembers are the members the owner sa lists (spec.sharedRole.members, validated by the API
// server as <cluster>/<namespace>/<name>).
func ownerMembers(sa *iamv1alpha1.IAMServiceAccount) ([]irsa.Member, error) {
	var out []irsa.Member
	for _, s := range sa.Spec.SharedRole.Members {
		m, err := irsa.ParseMember(s)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// revoke takes sa's statements out of the shared role's trust policy (when they are there) and
// returns the outcome o that refused it, saying so: an object that may no longer use the role
// loses it at once, not at its deletion.
func (r *ServiceAccountReconciler) revoke(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, role *awsiam.Role, o status.Outcome, ch *changes) status.Outcome {
	wrote, err := r.ensureSharedTrust(ctx, sa, role, irsa.Parts{})
	if err != nil {
		return r.roleFailure(sa, err)
	}
	if wrote {
		ch.trustWritten = true
		ch.add("removed this IAMServiceAccount's statements from the trust policy of shared role %s", role.ARN)
		o.Message += "; its statements were taken out of the role's trust policy"
	}
	return o
}

// ownerOf names the owner of a shared role from its tags ("" when it has none).
func ownerOf(tags map[string]string) string {
	if tags[irsa.TagCluster] == "" {
		return ""
	}
	return irsa.Member{Cluster: tags[irsa.TagCluster], Namespace: tags[irsa.TagNamespace], Name: tags[irsa.TagName]}.String()
}

// sharedOwnership checks that an existing role is the shared role sa names and that sa may use
// it, and makes its ownership what sa's spec says: an owner takes over a role without one when
// the last owner listed it, a former owner that is now a member releases it (listing itself),
// the owner keeps the role's member list as its spec says. Another object's ownership is a
// conflict for an owner; a member its owner does not list is refused, and its statements leave
// the trust policy.
func (r *ServiceAccountReconciler) sharedOwnership(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, role *awsiam.Role, ch *changes) *status.Outcome {
	name := sa.Spec.SharedRole.Name
	if role.Tags[irsa.TagSharedRole] != name {
		return ptr.To(status.WaitsForPerson(ReasonConflict, fmt.Sprintf(
			"IAM role %s exists and is not a Quartermaster shared role (tag %s=%s); it is left alone: name another role",
			name, irsa.TagSharedRole, name), r.SlowRetry))
	}
	if o := r.sharedNamespace(sa); o != nil {
		return ptr.To(r.revoke(ctx, sa, role, *o, ch))
	}
	me := r.member(sa)
	ours := irsa.OwnedBy(role.Tags, r.cfg.cluster, sa.Namespace, sa.Name)
	owner := ownerOf(role.Tags)
	listed := func() string {
		if l := irsa.ListedMembers(role.Tags); len(l) > 0 {
			return strings.Join(l, ", ")
		}
		return "none"
	}
	switch {
	case sa.Spec.SharedRole.Owner && !ours && owner != "":
		return ptr.To(status.WaitsForPerson(ReasonConflict, fmt.Sprintf(
			"shared role %s is owned by %s: one IAMServiceAccount writes a shared role's permissions; set sharedRole.owner: false here, or release it there (owner: false, or delete it)",
			name, owner), r.SlowRetry))
	case sa.Spec.SharedRole.Owner && !ours:
		if !irsa.Admits(role.Tags, me) {
			return ptr.To(r.revoke(ctx, sa, role, status.WaitsForPerson(ReasonSharedRoleNotListed, fmt.Sprintf(
				"shared role %s has no owner, and only a member its last owner listed may take it over (listed: %s); this IAMServiceAccount is %s",
				name, listed(), me), r.SlowRetry), ch))
		}
		// The new owner's spec becomes the role's permissions: what the last owner attached is
		// detached unless the spec names it, and its inline policies are taken as this object's
		// (deleted unless the spec names them), as if this object had put them.
		inline, err := r.aws.ListInlinePolicies(ctx, name)
		if err != nil {
			return ptr.To(awsFailure(err, r.SlowRetry))
		}
		tags := irsa.Tags(r.cfg.cluster, sa.Namespace, sa.Name)
		if err := r.aws.TagRole(ctx, name, tags); err != nil {
			return ptr.To(awsFailure(err, r.SlowRetry))
		}
		maps.Copy(role.Tags, tags)
		sa.Status.InlinePolicies = slices.Compact(slices.Sorted(slices.Values(append(sa.Status.InlinePolicies, inline...))))
		ch.add("took ownership of shared role %s", role.ARN)
		// Another listed member may have taken it over at the same moment (IAM has no
		// conditional write; the last tags written win): the permissions are written once a
		// read a settle time later still names this object.
		return ptr.To(status.Progressing(ReasonSharedRoleTakingOver, fmt.Sprintf(
			"took ownership of shared role %s, which had no owner; its permissions are written once a read %s later still names this object its owner",
			role.ARN, r.sharedSettle), r.sharedSettle))
	case !sa.Spec.SharedRole.Owner && ours:
		// The former owner stays a member: it lists itself as it leaves the list to whoever owns
		// the role next.
		if err := r.aws.TagRole(ctx, name, irsa.MemberTags([]irsa.Member{me})); err != nil {
			return ptr.To(awsFailure(err, r.SlowRetry))
		}
		maps.Copy(role.Tags, irsa.MemberTags([]irsa.Member{me}))
		if err := r.releaseRole(ctx, role); err != nil {
			return ptr.To(awsFailure(err, r.SlowRetry))
		}
		ch.add("released ownership of shared role %s (its permissions stay as they are)", role.ARN)
	case !sa.Spec.SharedRole.Owner && !irsa.Admits(role.Tags, me):
		owned := "has no owner"
		if owner != "" {
			owned = "is owned by " + owner
		}
		return ptr.To(r.revoke(ctx, sa, role, status.WaitsForPerson(ReasonSharedRoleNotListed, fmt.Sprintf(
			"shared role %s %s, whose sharedRole.members does not name this IAMServiceAccount (%s; listed: %s): only the members its owner lists get the role",
			name, owned, me, listed()), r.SlowRetry), ch))
	case sa.Spec.SharedRole.Owner:
		if err := r.ensureMemberTags(ctx, sa, role, ch); err != nil {
			return ptr.To(awsFailure(err, r.SlowRetry))
		}
	}
	return nil
}

// ensureMemberTags makes the member list on the role the owner sa's spec.sharedRole.members.
func (r *ServiceAccountReconciler) ensureMemberTags(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, role *awsiam.Role, ch *changes) error {
	members, err := ownerMembers(sa)
	if err != nil {
		return err
	}
	set, unset := irsa.MemberTagsDiff(role.Tags, members)
	if len(set) > 0 {
		if err := r.aws.TagRole(ctx, role.Name, set); err != nil {
			return err
		}
		maps.Copy(role.Tags, set)
	}
	if len(unset) > 0 {
		if err := r.aws.UntagRole(ctx, role.Name, unset); err != nil {
			return err
		}
		for _, k := range unset {
			delete(role.Tags, k)
		}
	}
	if len(set)+len(unset) > 0 {
		ch.add("shared role %s lists %d members", role.ARN, len(members))
	}
	return nil
}

// releaseRole takes the ownership tags off a shared role, leaving its permissions as they are.
func (r *ServiceAccountReconciler) releaseRole(ctx context.Context, role *awsiam.Role) error {
	keys := []string{irsa.TagCluster, irsa.TagNamespace, irsa.TagName}
	if err := r.aws.UntagRole(ctx, role.Name, keys); err != nil {
		return err
	}
	for _, k := range keys {
		delete(role.Tags, k)
	}
	return nil
}

// sharedWriteWindow bounds the time from the read a shared role's trust policy is merged from to
// the end of its write (the write's retries included), and sharedSettleTime is how long after a
// write the writer reads the policy again. A writer that read the policy before another's write can
// only land its stale write within the window after that read, so a check one settle time later
// sees every write that could have dropped the writer's statements.
const (
	sharedWriteWindow = 10 * time.Second
	sharedSettleTime  = 2 * sharedWriteWindow
)

// keyedMutex is a mutex per key, made on first use (a handful of shared roles per manager).
type keyedMutex struct{ m sync.Map }

func (k *keyedMutex) lock(key string) (unlock func()) {
	mu, _ := k.m.LoadOrStore(key, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	return mu.(*sync.Mutex).Unlock
}

// ensureSharedTrust writes sa's statements for the mechanisms in trust into the shared role's
// trust policy, leaving every other statement as it is, and says whether it wrote; role.TrustPolicy
// is what IAM holds afterwards. IAM has no conditional write, so the write is merged into a read
// made just before it, bounded by sharedWriteWindow, and followed by a read that must show the
// statements (errTrustOverwritten when another operator's write from an older read dropped them:
// written again at the next attempt); the caller reads again after sharedSettle (a write that
// could still drop them lands before that).
func (r *ServiceAccountReconciler) ensureSharedTrust(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, role *awsiam.Role, trust irsa.Parts) (bool, error) {
	t, err := r.memberTrust(ctx, sa, role)
	if err != nil {
		return false, err
	}
	if holds, err := irsa.SharedTrustHolds(role.TrustPolicy, t, trust); err == nil && holds {
		return false, nil
	}
	// This manager's members of one role write it one at a time (other clusters' still race).
	unlock := r.sharedWriters.lock(role.Name)
	defer unlock()
	wctx, cancel := context.WithTimeout(ctx, sharedWriteWindow)
	defer cancel()
	fresh, err := r.aws.GetRole(wctx, role.Name) // the read the write is merged into
	if err != nil {
		return false, err
	}
	role.TrustPolicy = fresh.TrustPolicy
	if holds, err := irsa.SharedTrustHolds(fresh.TrustPolicy, t, trust); err == nil && holds {
		return false, nil
	}
	doc, err := irsa.MergeShared(fresh.TrustPolicy, t, trust)
	if err != nil {
		return false, fmt.Errorf("the trust policy of shared role %s: %w", role.Name, err)
	}
	if err := r.aws.UpdateTrustPolicy(wctx, role.Name, doc); err != nil {
		return false, err
	}
	again, err := r.aws.GetRole(ctx, role.Name)
	if err != nil {
		return false, err
	}
	role.TrustPolicy = again.TrustPolicy
	if holds, err := irsa.SharedTrustHolds(again.TrustPolicy, t, trust); err != nil || !holds {
		return false, errTrustOverwritten
	}
	return true, nil
}

// roleFailure is the outcome of a failed step on the role: for a shared role's trust policy, a
// policy over IAM's quota says so with what to do, and a write lost to another writer is retried;
// anything else is awsFailure's.
func (r *ServiceAccountReconciler) roleFailure(sa *iamv1alpha1.IAMServiceAccount, err error) status.Outcome {
	switch {
	case errors.Is(err, errTrustOverwritten):
		return status.Transient(ReasonConflict, err.Error(), err)
	case isShared(sa) && awsiam.ErrorCode(err) == "LimitExceeded":
		return status.WaitsForPerson(ReasonSharedRoleTrustFull, fmt.Sprintf(
			"the trust policy of shared role %s has no room for this member's statement (%s): each member adds one statement per mechanism; raise the account's quota \"Role trust policy length\" (2,048 characters by default, 4,096 at most) or let fewer IAMServiceAccounts share the role",
			sa.Spec.SharedRole.Name, awsiam.StatusMessage(err)), r.SlowRetry)
	}
	return awsFailure(err, r.SlowRetry)
}

// observeShared records in status what the role's tags and trust policy say of its owner and its
// other members.
func (r *ServiceAccountReconciler) observeShared(sa *iamv1alpha1.IAMServiceAccount, role *awsiam.Role) {
	others, err := irsa.SharedMembers(role.TrustPolicy, r.member(sa))
	if err != nil {
		others = nil // IAM holds a valid document; a parse failure only shortens the list
	}
	if len(others) > maxTrustedBy {
		others = append(others[:maxTrustedBy], fmt.Sprintf("and %d more", len(others)-maxTrustedBy))
	}
	sa.Status.SharedRole = &iamv1alpha1.SharedRoleStatus{Owner: ownerOf(role.Tags), TrustedBy: others, Members: irsa.ListedMembers(role.Tags)}
}

// sharedReadyNote completes the Ready message of a shared role's member.
func sharedReadyNote(sa *iamv1alpha1.IAMServiceAccount) string {
	s := sa.Status.SharedRole
	if s == nil {
		return ""
	}
	owner := "no owner (permissions as the last owner left them)"
	if s.Owner != "" {
		owner = "owned by " + s.Owner
	}
	return fmt.Sprintf("; shared role, %s, trusted by %d other members", owner, len(s.TrustedBy))
}

// deleteShared takes sa's statements out of the shared role's trust policy. The role itself is
// deleted only when no member's statement is left in it and it is sa's own or has no owner; an
// owner leaving a role others still use releases it instead (the permissions stay, for them).
func (r *ServiceAccountReconciler) deleteShared(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount) *status.Outcome {
	name := sa.Spec.SharedRole.Name
	role, err := r.aws.GetRole(ctx, name)
	switch {
	case awsiam.IsNotFound(err):
		return nil
	case err != nil:
		return ptr.To(awsFailure(err, r.SlowRetry))
	case role.Tags[irsa.TagSharedRole] != name:
		r.recorder.Eventf(sa, nil, corev1.EventTypeWarning, ReasonConflict, "Delete", "IAM role %s is not a Quartermaster shared role; left in AWS", name)
		return nil
	}
	if wrote, err := r.ensureSharedTrust(ctx, sa, role, irsa.Parts{}); err != nil {
		return ptr.To(r.roleFailure(sa, err))
	} else if wrote {
		// A write from an older read could still bring the statements back: the object goes once
		// a read a settle time later shows them gone without a write.
		return ptr.To(status.Progressing(ReasonDeleting, fmt.Sprintf(
			"removed this member's statements from the trust policy of shared role %s; reading it again before letting the object go", role.ARN), r.sharedSettle))
	}
	others, err := irsa.SharedMembers(role.TrustPolicy, r.member(sa))
	if err != nil {
		return ptr.To(status.Transient(ReasonDeleting, err.Error(), err))
	}
	ours := irsa.OwnedBy(role.Tags, r.cfg.cluster, sa.Namespace, sa.Name)
	switch {
	case len(others) > 0 && ours:
		if err := r.releaseRole(ctx, role); err != nil {
			return ptr.To(awsFailure(err, r.SlowRetry))
		}
		r.recorder.Eventf(sa, nil, corev1.EventTypeWarning, "SharedRoleKept", "Delete",
			"shared role %s kept for the %d members still using it (%s); released with its permissions: another IAMServiceAccount with sharedRole.owner may take it over", role.ARN, len(others), strings.Join(others, "; "))
		return nil
	case len(others) > 0 || (!ours && ownerOf(role.Tags) != ""):
		r.recorder.Eventf(sa, nil, corev1.EventTypeNormal, "SharedRoleLeft", "Delete", "removed this member's statements from the trust policy of shared role %s", role.ARN)
		return nil
	}
	// No member left, and the role is ours or nobody's. Statements someone wrote by hand still
	// admit someone: the role stays for them, released.
	foreign, err := irsa.ForeignStatements(role.TrustPolicy)
	if err != nil {
		return ptr.To(status.Transient(ReasonDeleting, err.Error(), err))
	}
	if len(foreign) > 0 {
		if ours {
			if err := r.releaseRole(ctx, role); err != nil {
				return ptr.To(awsFailure(err, r.SlowRetry))
			}
		}
		r.recorder.Eventf(sa, nil, corev1.EventTypeWarning, "SharedRoleKept", "Delete",
			"shared role %s kept, without owner and with its permissions: no member uses it, but its trust policy holds statements Quartermaster did not write (%s); delete the role by hand once they are not needed", role.ARN, strings.Join(foreign, ", "))
		return nil
	}
	// Nothing admits anyone any more: the role goes, with the permissions on it (the owner's
	// inline policies, which a role without owner no longer records).
	inline, err := r.aws.ListInlinePolicies(ctx, name)
	if err != nil && !awsiam.IsNotFound(err) {
		return ptr.To(awsFailure(err, r.SlowRetry))
	}
	if o := r.deleteRole(ctx, name, inline); o != nil {
		return o
	}
	r.recorder.Eventf(sa, nil, corev1.EventTypeNormal, "RoleDeleted", "Delete", "deleted shared role %s: no member uses it any more", role.ARN)
	return nil
}

// sharedMembersChanged passes updates of a shared role's owner whose status.sharedRole lists
// other members than before (a member's own status following the list wakes no one).
func sharedMembersChanged() predicate.Predicate {
	members := func(o client.Object) []string {
		if sa, ok := o.(*iamv1alpha1.IAMServiceAccount); ok && isShared(sa) && sa.Spec.SharedRole.Owner && sa.Status.SharedRole != nil {
			return sa.Status.SharedRole.Members
		}
		return nil
	}
	return updatesOnly(func(old, new client.Object) bool { return !slices.Equal(members(old), members(new)) })
}

// othersSharing are the IAMServiceAccounts of this cluster, but obj, that name obj's shared role.
func (r *ServiceAccountReconciler) othersSharing(ctx context.Context, obj client.Object) []reconcile.Request {
	sa, ok := obj.(*iamv1alpha1.IAMServiceAccount)
	if !ok || sa.Spec.SharedRole == nil {
		return nil
	}
	list := &iamv1alpha1.IAMServiceAccountList{}
	if err := r.client.List(ctx, list, client.MatchingFields{indexSharedRole: sa.Spec.SharedRole.Name}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		if key := client.ObjectKeyFromObject(&list.Items[i]); key != client.ObjectKeyFromObject(sa) {
			reqs = append(reqs, reconcile.Request{NamespacedName: key})
		}
	}
	return reqs
}
