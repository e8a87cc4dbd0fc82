// Package irsa is the pure logic of the iam controller (IAM roles for ServiceAccounts): the names,
// paths and tags of the AWS objects it creates, role trust policies, the documents of cross-account
// target roles (target.go), rendering and comparing policy documents, the --allowed-policy-arns patterns, and choosing which policy version to prune. It has
// no Kubernetes or AWS client; the controller observes IAM, asks this package what it should look
// like, and acts on the difference.
package irsa

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

// Tag keys on every AWS object the operator creates. Names and paths can collide or be shortened,
// so these tags, not the name, are what prove an object is ours: the controller only changes or
// deletes an object whose tags are exactly this cluster's and this Kubernetes object's (OwnedBy).
const (
	TagCluster   = "quartermaster.dev/cluster"
	TagNamespace = "quartermaster.dev/namespace"
	// TagName is the Kubernetes object's name: the IAMPolicy's name for a policy, the
	// IAMServiceAccount's name for a role.
	TagName = "quartermaster.dev/name"
)

// IAM's limits on the names the operator chooses.
const (
	MaxRoleName   = 64
	MaxPolicyName = 128
)

// hashLen is how many hex digits of SHA-256 a shortened name ends with (40 bits: a collision
// between two shortened names of one account is not a practical concern, and the tags catch it).
const hashLen = 10

// maxClusterName is the longest cluster name: it is a tag value (at most 256 characters), and the
// path /quartermaster/<cluster>/ (at most 512) is never the tighter limit.
const maxClusterName = 256

// Path is the IAM path of every role and policy the operator creates for a cluster,
// "/quartermaster/<cluster>/". One path per cluster lets the controller list only its own objects
// (ListRoles/ListPolicies take a path prefix) and lets an account's admins scope permissions to it.
func Path(cluster string) string { return "/quartermaster/" + cluster + "/" }

// ValidClusterName checks the --cluster-name flag before anything is created with it. The name is
// part of an IAM path (characters \x21-\x7E, no "/", at most 512 in all) and a tag value (at most
// 256 characters of letters, digits, spaces and _.:/=+-@), so it must satisfy both: non-empty, at
// most 256 characters, each an ASCII letter or digit or one of _.:=+-@. Checking at start-up turns
// what would be an AWS validation error on every reconcile into one clear message.
func ValidClusterName(name string) error {
	if name == "" {
		return fmt.Errorf("--cluster-name must not be empty: it names this cluster's IAM path and tags")
	}
	if len(name) > maxClusterName {
		return fmt.Errorf("--cluster-name is %d characters long; at most %d fit in an IAM tag value", len(name), maxClusterName)
	}
	for i, r := range name {
		if !clusterNameChar(r) {
			return fmt.Errorf("--cluster-name %q has %q at position %d: only ASCII letters, digits and _.:=+-@ fit both an IAM path and a tag value",
				name, r, i)
		}
	}
	return nil
}

func clusterNameChar(c rune) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '_', '.', ':', '=', '+', '-', '@':
		return true
	}
	return false
}

// RoleName is the IAM role name of the ServiceAccount namespace/serviceAccount:
// "eks-sa-<namespace>-<serviceAccount>", readable in the AWS console and in CloudTrail. Longer than
// IAM's 64 characters it is cut and suffixed with "-" and 10 hex digits of
// SHA-256("<namespace>/<serviceAccount>"), so it is exactly 64 characters, deterministic, and two
// long names that share a prefix stay distinct.
//
// A name that fits is kept as is, even though two pairs can give the same plain name (namespace
// "a-b" with ServiceAccount "c", and namespace "a" with "b-c"): renaming every role to add a hash
// would be worse for users, and the tags (OwnedBy) decide whom an existing role belongs to, so the
// second pair gets a conflict rather than the first one's role.
func RoleName(namespace, serviceAccount string) string {
	return shorten("eks-sa-"+namespace+"-"+serviceAccount, namespace+"/"+serviceAccount, MaxRoleName)
}

// RoleDescription is the description of the role of ServiceAccount namespace/serviceAccount whose
// pods get it through mechanism m, e.g. "EKS Pod Identity role of ServiceAccount team-a/app
// (Quartermaster)". An IRSA role's is the one every role had before mechanisms existed.
func RoleDescription(m iamv1alpha1.Mechanism, namespace, serviceAccount string) string {
	return Needs(m).Mechanisms() + " role of ServiceAccount " + namespace + "/" + serviceAccount + " (Quartermaster)"
}

// PolicyName is the IAM policy name of the IAMPolicy namespace/name: "<namespace>-<name>",
// shortened like RoleName when longer than IAM's 128 characters.
func PolicyName(namespace, name string) string {
	return shorten(namespace+"-"+name, namespace+"/"+name, MaxPolicyName)
}

// shorten returns full when it fits max, otherwise its first characters and a hash of key, max long.
// The hash is of key ("<namespace>/<name>") rather than full because "/" cannot occur in either
// part, so distinct pairs always hash distinct inputs.
func shorten(full, key string, maxLen int) string {
	if len(full) <= maxLen {
		return full
	}
	sum := sha256.Sum256([]byte(key))
	suffix := "-" + hex.EncodeToString(sum[:])[:hashLen]
	return full[:maxLen-len(suffix)] + suffix
}

// Tags returns the tags that mark an AWS object as the one made for the Kubernetes object
// namespace/name in cluster. A new map each call: the caller may add to it.
func Tags(cluster, namespace, name string) map[string]string {
	return map[string]string{
		TagCluster:   cluster,
		TagNamespace: namespace,
		TagName:      name,
	}
}

// TaggedByQuartermaster reports whether tags carry any of Quartermaster's ownership tags: such an
// object belongs to some Quartermaster object (of this or another cluster) and is never adopted.
func TaggedByQuartermaster(tags map[string]string) bool {
	for _, k := range []string{TagCluster, TagNamespace, TagName, TagSharedRole} {
		if _, ok := tags[k]; ok {
			return true
		}
	}
	return false
}

// AdoptPath reads an IAMPolicy's adopt annotation: the IAM path of the policy to adopt ("true":
// the operator's own path). ok is false for a value that is neither.
func AdoptPath(value, cluster string) (path string, ok bool) {
	switch {
	case value == "true":
		return Path(cluster), true
	case strings.HasPrefix(value, "/") && strings.HasSuffix(value, "/") && len(value) <= 512 && !strings.Contains(value, "//"):
		for _, r := range value {
			if r < 0x21 || r > 0x7e {
				return "", false
			}
		}
		return value, true
	}
	return "", false
}

// OwnedBy reports whether tags mark an AWS object as this cluster's object for namespace/name: all
// three tags present and equal. Anything else — untagged, another cluster's, another object's — is
// not ours to change or delete, even when its name is the one we would choose.
func OwnedBy(tags map[string]string, cluster, namespace, name string) bool {
	for k, want := range Tags(cluster, namespace, name) {
		if got, ok := tags[k]; !ok || got != want {
			return false
		}
	}
	return true
}
