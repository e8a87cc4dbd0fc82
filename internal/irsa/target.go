package irsa

import (
	"slices"
	"strings"

	awsarn "github.com/aws/aws-sdk-go-v2/aws/arn"
)

// Cross-account Pod Identity: EKS assumes the association's role, then the target role with the
// association's external ID. These are the documents on both sides.

// TargetActions are what an association's role does to its target: assume it, and tag the session
// unless EKS's session tags are off.
func TargetActions(sessionTags bool) []string {
	if !sessionTags {
		return []string{"sts:AssumeRole"}
	}
	return []string{"sts:AssumeRole", "sts:TagSession"}
}

// AssumeTargetPolicy is the identity policy letting a role do actions on the target role.
func AssumeTargetPolicy(target string, actions []string) string {
	doc, err := marshal(map[string]any{"Version": "2012-10-17", "Statement": []any{map[string]any{
		"Sid": "AssumeTargetRole", "Effect": "Allow", "Action": actions, "Resource": target,
	}}})
	if err != nil { // strings and lists of strings always marshal
		panic("irsa: marshal assume policy: " + err.Error())
	}
	return doc
}

// TargetTrustStatement is the statement a target role's trust policy needs: role may do actions
// on it with the external ID.
func TargetTrustStatement(role, externalID string, actions []string) string {
	st, err := marshal(map[string]any{
		"Effect": "Allow", "Principal": map[string]any{"AWS": role}, "Action": actions,
		"Condition": map[string]any{"StringEquals": map[string]any{"sts:ExternalId": externalID}},
	})
	if err != nil {
		panic("irsa: marshal trust statement: " + err.Error())
	}
	return st
}

// RoleAccountAndName returns a role ARN's account and role name (the last segment of its path);
// empty strings when it is not an ARN.
func RoleAccountAndName(arn string) (string, string) {
	a, err := awsarn.Parse(arn)
	if err != nil {
		return "", ""
	}
	return a.AccountID, a.Resource[strings.LastIndexByte(a.Resource, '/')+1:]
}

// TrustsWithExternalID reports whether a trust policy (raw or URL-encoded JSON) has an Allow
// statement that lets role (named, or its account's root) do every one of actions (named, or a
// wildcard over them) with the external ID (StringEquals, or StringLike with the ID itself).
func TrustsWithExternalID(doc, role, externalID string, actions []string) bool {
	d, err := parseDocument(doc)
	if err != nil {
		return false
	}
	account, _ := RoleAccountAndName(role)
	principals := []string{role, "arn:aws:iam::" + account + ":root", account}
	for _, v := range asList(d["Statement"]) {
		st, _ := v.(map[string]any)
		if st["Effect"] != "Allow" {
			continue
		}
		named, _ := st["Principal"].(map[string]any)
		if !slices.ContainsFunc(stringsOf(named["AWS"]), func(p string) bool { return slices.Contains(principals, p) }) ||
			!allAllowed(stringsOf(st["Action"]), actions) {
			continue
		}
		cond, _ := st["Condition"].(map[string]any)
		for _, op := range []string{"StringEquals", "StringLike"} {
			m, _ := cond[op].(map[string]any)
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
			return strings.EqualFold(a, want) || a == "sts:*" || a == "*"
		}) {
			return false
		}
	}
	return true
}

// stringsOf reads a policy element that is a string or a list of them (asList's strings).
func stringsOf(v any) []string {
	var out []string
	for _, e := range asList(v) {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
