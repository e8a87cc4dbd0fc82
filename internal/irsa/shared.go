package irsa

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Shared roles (spec.sharedRole): one role that IAMServiceAccounts of several clusters use. Its
// trust policy is a merge that no single writer owns: each IAMServiceAccount (a member) keeps its
// own statements in it, marked by a statement ID that only it computes (MemberSid), and leaves
// every other statement as it found it. IAM has no conditional write, so two operators that read
// the policy at once and both write lose one statement; each writer therefore reads the policy
// again after its write and writes again until its own statements are there (or, leaving, gone):
// the last write of every round holds its writer's statements, and a writer whose statements were
// dropped sees so and writes again, so every member's statements end up in the policy.

// SharedPath is the IAM path of shared roles: no cluster's path (Path), so one cluster's list of
// its roles never includes them.
const SharedPath = "/quartermaster-shared/"

// TagSharedRole marks a role as Quartermaster's shared role of that name. Its owner adds the three
// ownership tags (Tags); a role with only this tag has no owner (the owner left while others still
// used it), and the next IAMServiceAccount that asks to own it takes it over.
const TagSharedRole = "quartermaster.dev/shared-role"

// sidPattern is the statement ID of a member's statement: the mechanism and a digest of the member.
var sidPattern = regexp.MustCompile(`^Quartermaster(Irsa|PodIdentity)[0-9a-f]{16}$`)

// nobodySid marks the statement a trust policy holds when no member is left in it (IAM refuses a
// trust policy without statements): it admits nobody, and goes as soon as a member writes.
const nobodySid = "QuartermasterNobody"

// Member is one IAMServiceAccount using a shared role: the cluster (--cluster-name) whose operator
// writes its statements, and the object.
type Member struct{ Cluster, Namespace, Name string }

// String is the member as status and messages name it: <cluster>/<namespace>/<name>.
func (m Member) String() string { return m.Cluster + "/" + m.Namespace + "/" + m.Name }

// sid is the statement ID of m's statement for one mechanism (Irsa or PodIdentity). IAM allows
// only letters and digits in a statement ID, so the member is a digest: 64 bits of SHA-256 of
// "<cluster>/<namespace>/<name>" (no part can hold a "/", so distinct members hash distinct input).
func (m Member) sid(mechanism string) string {
	sum := sha256.Sum256([]byte(m.String()))
	return "Quartermaster" + mechanism + hex.EncodeToString(sum[:8])
}

// MemberTrust is what one member's statements admit.
type MemberTrust struct {
	Member Member
	// ServiceAccount is the ServiceAccount (in Member.Namespace) whose pods assume the role.
	ServiceAccount string
	// Partition, AccountID and Issuer are the member's cluster's OIDC provider (IRSA).
	Partition, AccountID, Issuer string
	// EKSCluster is the EKS cluster of the member's Pod Identity association.
	EKSCluster string
	// Owner: the member is the role's owner, and Listed the members it lists; the owner's
	// writes also take out the statements of every member it does not list (dropped from its
	// list, or written by an operator that did not check it).
	Owner  bool
	Listed []Member
}

// SharedRoleDescription is the description a shared role's owner gives it.
func SharedRoleDescription(owner Member) string {
	return "Role shared by Quartermaster IAMServiceAccounts of several clusters, owned by " + owner.String()
}

// statements are t's statements admitting the mechanisms in parts. The IRSA one is the one
// TrustPolicy writes for the cluster's provider; the Pod Identity one admits EKS Pod Identity only
// for the ServiceAccount's pods in that EKS cluster, by the session tags EKS adds (the conditions
// AWS documents for sharing a Pod Identity role): without them any association in the account
// could assume the role.
func (t MemberTrust) statements(parts Parts) []trustStatement {
	var out []trustStatement
	if parts.Annotation {
		iss := bareIssuer(t.Issuer)
		out = append(out, trustStatement{
			Sid: t.Member.sid("Irsa"), Effect: "Allow",
			Principal: map[string]string{"Federated": ProviderARN(t.Partition, t.AccountID, iss)},
			Action:    "sts:AssumeRoleWithWebIdentity",
			Condition: map[string]map[string]string{"StringEquals": {
				iss + ":sub": "system:serviceaccount:" + t.Member.Namespace + ":" + t.ServiceAccount,
				iss + ":aud": stsAudience,
			}},
		})
	}
	if parts.Association {
		out = append(out, trustStatement{
			Sid: t.Member.sid("PodIdentity"), Effect: "Allow",
			Principal: map[string]string{"Service": PodIdentityPrincipal},
			Action:    []string{"sts:AssumeRole", "sts:TagSession"},
			Condition: map[string]map[string]string{"StringEquals": {
				"aws:RequestTag/eks-cluster-name":           t.EKSCluster,
				"aws:RequestTag/kubernetes-namespace":       t.Member.Namespace,
				"aws:RequestTag/kubernetes-service-account": t.ServiceAccount,
			}},
		})
	}
	return out
}

// MergeShared returns the trust policy doc (raw or URL-encoded JSON, as IAM returns it; "" for a
// role not made yet) with t's member's statements replaced by those admitting the mechanisms in
// parts (none: the member leaves), and, when t is the owner's, without the statements of members
// it does not list. Every other statement, and every other element of the document, is kept as
// it is. A policy left without statements gets one that admits nobody.
func MergeShared(doc string, t MemberTrust, parts Parts) (string, error) {
	d := map[string]any{"Version": "2012-10-17"}
	if strings.TrimSpace(doc) != "" {
		var err error
		if d, err = parseDocument(doc); err != nil {
			return "", err
		}
	}
	mine := []string{t.Member.sid("Irsa"), t.Member.sid("PodIdentity"), nobodySid}
	listed := map[string]bool{}
	for _, m := range t.Listed {
		listed[m.sid("Irsa")], listed[m.sid("PodIdentity")] = true, true
	}
	var statements []any
	if st, ok := d["Statement"]; ok {
		statements = slices.Clone(asList(st))
	}
	kept := slices.DeleteFunc(statements, func(st any) bool {
		sid := sidOf(st)
		return slices.Contains(mine, sid) || (t.Owner && sidPattern.MatchString(sid) && !listed[sid])
	})
	for _, st := range t.statements(parts) {
		m, err := asMap(st)
		if err != nil {
			return "", err
		}
		kept = append(kept, m)
	}
	if len(kept) == 0 {
		kept = append(kept, map[string]any{
			"Sid": nobodySid, "Effect": "Deny", "Principal": map[string]any{"AWS": "*"}, "Action": "sts:*",
		})
	}
	d["Statement"] = kept
	return marshal(d)
}

// SharedTrustHolds reports whether the trust policy doc holds exactly t's statements for parts:
// what a writer checks after its write, since another writer may have replaced the document.
func SharedTrustHolds(doc string, t MemberTrust, parts Parts) (bool, error) {
	want, err := MergeShared(doc, t, parts)
	if err != nil {
		return false, err
	}
	return Equivalent(doc, want)
}

// SharedMembers describes the members' statements in the trust policy doc except member's own,
// one line each ("system:serviceaccount:ns:sa through oidc.example.com/id/ABC (IRSA)", "ns/sa in
// EKS cluster prod (Pod Identity)"), in the document's order. Statements without a member's ID
// (written by hand) are not members.
func SharedMembers(doc string, member Member) ([]string, error) {
	d, err := parseDocument(doc)
	if err != nil {
		return nil, err
	}
	own := []string{member.sid("Irsa"), member.sid("PodIdentity")}
	var out []string
	for _, st := range asList(d["Statement"]) {
		sid := sidOf(st)
		if !sidPattern.MatchString(sid) || slices.Contains(own, sid) {
			continue
		}
		out = append(out, describeMember(st.(map[string]any), sid))
	}
	return out, nil
}

// describeMember says whom a member's statement admits, from its conditions.
func describeMember(st map[string]any, sid string) string {
	eq, _ := st["Condition"].(map[string]any)
	if eq != nil {
		eq, _ = eq["StringEquals"].(map[string]any)
	}
	value := func(key string) string {
		for k, v := range eq {
			if strings.EqualFold(k, key) { // IAM's condition keys are case-insensitive
				if s := stringsOf(v); len(s) == 1 {
					return s[0]
				}
			}
		}
		return ""
	}
	if strings.HasPrefix(sid, "QuartermasterIrsa") {
		for k, v := range eq {
			if iss, ok := strings.CutSuffix(k, ":sub"); ok {
				if s := stringsOf(v); len(s) == 1 {
					return s[0] + " through " + iss + " (IRSA)"
				}
			}
		}
	} else if c, ns, sa := value("aws:RequestTag/eks-cluster-name"), value("aws:RequestTag/kubernetes-namespace"), value("aws:RequestTag/kubernetes-service-account"); c != "" {
		return ns + "/" + sa + " in EKS cluster " + c + " (Pod Identity)"
	}
	return "statement " + sid
}

// sidOf is a statement's Sid ("" when it has none).
func sidOf(st any) string {
	m, _ := st.(map[string]any)
	s, _ := m["Sid"].(string)
	return s
}

// asMap turns a statement into the generic form of a parsed document.
func asMap(st trustStatement) (map[string]any, error) {
	s, err := marshal(st)
	if err != nil {
		return nil, err
	}
	m, err := parseDocument(s)
	if err != nil {
		return nil, errors.New("irsa: a statement does not read back: " + err.Error())
	}
	return m, nil
}

// TagMemberPrefix starts the tags in which a shared role's owner lists the IAMServiceAccounts
// that may use the role (spec.sharedRole.members): one tag per member, its key this prefix and the
// member's digest (as in its statement IDs), its value the member as <cluster>/<namespace>/<name>.
// Every operator reads them before it writes a member's statement into the trust policy, and
// before it lets an IAMServiceAccount take over a role that has no owner: whoever can create an
// IAMServiceAccount in some cluster cannot join a role whose owner did not name it.
const TagMemberPrefix = "quartermaster.dev/member-"

// MaxListedMembers bounds the members a shared role's tags list (IAM allows 50 tags on a role;
// the trust policy's quota fits fewer members' statements than that anyway).
const MaxListedMembers = 20

// ParseMember reads <cluster>/<namespace>/<name>.
func ParseMember(s string) (Member, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return Member{}, fmt.Errorf("member %q is not <cluster>/<namespace>/<name>", s)
	}
	if err := ValidClusterName(parts[0]); err != nil {
		return Member{}, fmt.Errorf("member %q: %w", s, err)
	}
	return Member{Cluster: parts[0], Namespace: parts[1], Name: parts[2]}, nil
}

// memberTagKey is the key of m's tag in a shared role's member list.
func (m Member) memberTagKey() string {
	sum := sha256.Sum256([]byte(m.String()))
	return TagMemberPrefix + hex.EncodeToString(sum[:8])
}

// MemberTags are the tags listing members on a shared role.
func MemberTags(members []Member) map[string]string {
	tags := make(map[string]string, len(members))
	for _, m := range members {
		tags[m.memberTagKey()] = m.String()
	}
	return tags
}

// ListedMembers are the members a shared role's tags list, sorted.
func ListedMembers(tags map[string]string) []string {
	var out []string
	for k, v := range tags {
		if strings.HasPrefix(k, TagMemberPrefix) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// Admits reports whether a shared role's tags list m among its members: the tag under m's key
// naming m exactly (a tag written by hand under another key admits nobody).
func Admits(tags map[string]string, m Member) bool {
	return tags[m.memberTagKey()] == m.String()
}

// MemberTagsDiff is what to tag and what to untag so that tags list exactly want.
func MemberTagsDiff(tags map[string]string, want []Member) (set map[string]string, unset []string) {
	wanted := MemberTags(want)
	set = map[string]string{}
	for k, v := range wanted {
		if tags[k] != v {
			set[k] = v
		}
	}
	for k := range tags {
		if _, ok := wanted[k]; !ok && strings.HasPrefix(k, TagMemberPrefix) {
			unset = append(unset, k)
		}
	}
	slices.Sort(unset)
	return set, unset
}

// ForeignStatements are the statement IDs (or "a statement without Sid") of the statements in a
// shared role's trust policy that no member wrote: someone's own, written by hand. A role holding
// any is never deleted by its last member.
func ForeignStatements(doc string) ([]string, error) {
	d, err := parseDocument(doc)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, st := range asList(d["Statement"]) {
		switch sid := sidOf(st); {
		case sid == nobodySid || sidPattern.MatchString(sid):
		case sid == "":
			out = append(out, "a statement without Sid")
		default:
			out = append(out, sid)
		}
	}
	return out, nil
}
