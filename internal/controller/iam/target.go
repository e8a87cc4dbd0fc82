package iam

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
)

// targetPolicyName is the inline policy that lets an object's role assume its target role.
const targetPolicyName = "quartermaster-target-role"

// Reasons of a target role that does not (yet) take the association's credentials.
const (
	ReasonTargetRoleNotFound    = "TargetRoleNotFound"
	ReasonTargetRoleNotTrusting = "TargetRoleNotTrusting"
)

// targetActions are what the association's role does to the target: assume it, with EKS's
// session tags unless they are off.
func targetActions(sa *iamv1alpha1.IAMServiceAccount) []string {
	if sa.Spec.DisableSessionTags {
		return []string{"sts:AssumeRole"}
	}
	return []string{"sts:AssumeRole", "sts:TagSession"}
}

// targetPermission is the inline policy letting the object's role assume its target role.
func targetPermission(sa *iamv1alpha1.IAMServiceAccount) string {
	doc, _ := json.Marshal(map[string]any{"Version": "2012-10-17", "Statement": []any{map[string]any{
		"Sid": "AssumeTargetRole", "Effect": "Allow", "Action": targetActions(sa), "Resource": sa.Spec.TargetRoleArn,
	}}})
	return string(doc)
}

// targetTrust is the statement the target role's trust policy needs: the object's role may assume
// it with the association's external ID.
func targetTrust(sa *iamv1alpha1.IAMServiceAccount, roleARN, externalID string) string {
	st, _ := json.Marshal(map[string]any{
		"Effect": "Allow", "Principal": map[string]any{"AWS": roleARN}, "Action": targetActions(sa),
		"Condition": map[string]any{"StringEquals": map[string]any{"sts:ExternalId": externalID}},
	})
	return string(st)
}

// checkTarget says whether the target role takes the association's credentials. A target in this
// account is read: missing, or its trust not admitting the role with the external ID, stalls the
// object with the statement to add. One in another account cannot be read from here: the Ready
// message says what its trust must hold (note).
func (r *ServiceAccountReconciler) checkTarget(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, roleARN string) (string, *status.Outcome) {
	target := sa.Spec.TargetRoleArn
	rec := sa.Status.PodIdentityAssociation
	if target == "" || rec == nil {
		return "", nil
	}
	need := targetTrust(sa, roleARN, rec.ExternalID)
	account, name := roleAccountAndName(target)
	ours, err := r.accountID(ctx)
	if err != nil {
		o := awsFailure(err, r.SlowRetry)
		return "", &o
	}
	if account != ours {
		return fmt.Sprintf("; pods get target role %s (account %s, not readable from here): its trust policy must hold %s", target, account, need), nil
	}
	role, err := r.aws.GetRole(ctx, name)
	switch {
	case awsiam.IsNotFound(err):
		o := status.WaitsForPerson(ReasonTargetRoleNotFound, fmt.Sprintf("target role %s does not exist; create it with a trust policy holding %s", target, need), r.SlowRetry)
		return "", &o
	case err != nil:
		o := awsFailure(err, r.SlowRetry)
		return "", &o
	}
	if !trustsWithExternalID(role.TrustPolicy, roleARN, rec.ExternalID, targetActions(sa)) {
		o := status.WaitsForPerson(ReasonTargetRoleNotTrusting, fmt.Sprintf(
			"target role %s does not let role %s assume it with the association's external ID %s: add to its trust policy %s", target, roleARN, rec.ExternalID, need), r.SlowRetry)
		return "", &o
	}
	return fmt.Sprintf("; pods get target role %s (its trust requires external ID %s)", target, rec.ExternalID), nil
}

// roleAccountAndName splits a role ARN (validated at admission) into its account and role name.
func roleAccountAndName(arn string) (string, string) {
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) < 6 {
		return "", ""
	}
	return parts[4], parts[5][strings.LastIndexByte(parts[5], '/')+1:]
}

// trustsWithExternalID reports whether a trust policy has an Allow statement that lets principal
// (named, or its account's root) do every one of actions (named, or a wildcard over them) with the
// external ID (StringEquals, or StringLike with the ID itself).
func trustsWithExternalID(doc, principal, externalID string, actions []string) bool {
	account, _ := roleAccountAndName(principal)
	principals := []string{principal, "arn:aws:iam::" + account + ":root", account}
	var p struct {
		Statement json.RawMessage
	}
	if json.Unmarshal([]byte(doc), &p) != nil {
		return false
	}
	var statements []map[string]any
	if json.Unmarshal(p.Statement, &statements) != nil {
		var one map[string]any
		if json.Unmarshal(p.Statement, &one) != nil {
			return false
		}
		statements = []map[string]any{one}
	}
	for _, st := range statements {
		if st["Effect"] != "Allow" {
			continue
		}
		named, _ := st["Principal"].(map[string]any)
		if !slices.ContainsFunc(stringsOf(named["AWS"]), func(p string) bool { return slices.Contains(principals, p) }) {
			continue
		}
		allowed := stringsOf(st["Action"])
		if !allAllowed(allowed, actions) {
			continue
		}
		cond, _ := st["Condition"].(map[string]any)
		for op, kv := range cond {
			if op != "StringEquals" && op != "StringLike" {
				continue
			}
			m, _ := kv.(map[string]any)
			for k, v := range m {
				if strings.EqualFold(k, "sts:ExternalId") && slices.Contains(stringsOf(v), externalID) {
					return true
				}
			}
		}
	}
	return false
}

// allAllowed reports whether every action is one of allowed, or matched by its wildcards (sts:*, *).
func allAllowed(allowed, actions []string) bool {
	for _, want := range actions {
		if !slices.ContainsFunc(allowed, func(a string) bool {
			a = strings.ToLower(a)
			return a == strings.ToLower(want) || a == "sts:*" || a == "*"
		}) {
			return false
		}
	}
	return true
}

// stringsOf reads a policy element that is a string or a list of strings.
func stringsOf(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}
