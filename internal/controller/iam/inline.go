package iam

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
)

// maxInlineSize is IAM's limit on a role's inline policies together, whitespace not counted.
const maxInlineSize = 10240

// inlineDocuments are the spec's inline policies as IAM takes them (name → JSON), or the outcome
// that stops them: a document that is no policy, or documents together over IAM's limit.
func (r *ServiceAccountReconciler) inlineDocuments(sa *iamv1alpha1.IAMServiceAccount) (map[string]string, *status.Outcome) {
	want := map[string]string{}
	total := 0
	for _, p := range sa.Spec.InlinePolicies {
		doc, err := irsa.PolicyDocumentJSON(p.Document)
		if err != nil {
			o := status.WaitsForPerson("MalformedPolicyDocument", fmt.Sprintf("inline policy %s: %v", p.Name, err), r.SlowRetry)
			return nil, &o
		}
		want[p.Name] = doc
		for _, c := range doc {
			if !unicode.IsSpace(c) {
				total++
			}
		}
	}
	if sa.Spec.TargetRoleArn != "" {
		want[targetPolicyName] = irsa.AssumeTargetPolicy(sa.Spec.TargetRoleArn, targetActions(sa)) // counted with the others: IAM counts it too
		total += len(want[targetPolicyName])
	}
	if total > maxInlineSize {
		o := status.WaitsForPerson("LimitExceeded", fmt.Sprintf(
			"spec.inlinePolicies are %d characters together (whitespace not counted); IAM allows a role %d: move some into IAMPolicies (spec.policies)", total, maxInlineSize), r.SlowRetry)
		return nil, &o
	}
	return want, nil
}

// ensureInline brings the role's inline policies to the spec: those it put and the spec dropped
// are deleted first (making room under IAM's size limit), one whose document differs in meaning
// (irsa.Equivalent) is rewritten, a missing one is put. Inline policies it did not put are left
// alone. A role with none in the spec and none put costs no call; otherwise one list and one read
// per policy.
func (r *ServiceAccountReconciler) ensureInline(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, role string, ch *changes) *status.Outcome {
	want, o := r.inlineDocuments(sa)
	if o != nil {
		return o
	}
	put := sa.Status.InlinePolicies
	if len(want) == 0 && len(put) == 0 {
		return nil
	}
	// The status names what is on the role at every return, so a policy put before a failure is
	// still known as ours (and deleted when it leaves the spec).
	recorded := map[string]bool{}
	for _, n := range put {
		recorded[n] = true
	}
	defer func() { sa.Status.InlinePolicies = slices.Sorted(maps.Keys(recorded)) }()
	fail := func(err error) *status.Outcome {
		o := awsFailure(err, r.SlowRetry)
		if awsiam.IsNotFound(err) {
			o = propagating(err) // the role was just created or read
		}
		return &o
	}
	names, err := r.aws.ListInlinePolicies(ctx, role)
	if err != nil {
		return fail(err)
	}
	for _, name := range names {
		if _, ok := want[name]; !ok && slices.Contains(put, name) {
			if err := r.aws.DeleteInlinePolicy(ctx, role, name); err != nil && !awsiam.IsNotFound(err) {
				return fail(err)
			}
			delete(recorded, name)
			ch.add("deleted inline policy %s", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if slices.Contains(names, name) {
			current, err := r.aws.GetInlinePolicy(ctx, role, name)
			if err != nil && !awsiam.IsNotFound(err) {
				return fail(err)
			}
			if same, _ := irsa.Equivalent(current, want[name]); same && err == nil {
				continue
			}
		}
		if err := r.aws.PutInlinePolicy(ctx, role, name, want[name]); err != nil {
			return fail(err)
		}
		recorded[name] = true
		ch.add("put inline policy %s", name)
	}
	for name := range recorded {
		if _, ok := want[name]; !ok && !slices.Contains(names, name) {
			delete(recorded, name) // gone from the role already
		}
	}
	return nil
}

// foreignInline refuses to adopt a role holding inline policies Quartermaster did not put there:
// they would grant what no spec says. It names them and what to do.
func (r *ServiceAccountReconciler) foreignInline(ctx context.Context, role string) *status.Outcome {
	names, err := r.aws.ListInlinePolicies(ctx, role)
	if err != nil {
		o := awsFailure(err, r.SlowRetry)
		return &o
	}
	if len(names) == 0 {
		return nil
	}
	o := status.WaitsForPerson(ReasonConflict, fmt.Sprintf(
		"IAM role %s has inline policies Quartermaster did not put there (%s); it is not adopted: remove them from the role (move what they grant into spec.inlinePolicies or an IAMPolicy), then it is adopted",
		role, strings.Join(names, ", ")), r.SlowRetry)
	return &o
}
