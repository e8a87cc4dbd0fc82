package irsa

import (
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"
)

func sharedTrust(cluster, ns string) MemberTrust {
	return MemberTrust{
		Member: Member{Cluster: cluster, Namespace: ns, Name: "app"}, ServiceAccount: "app",
		Partition: "aws", AccountID: "123456789012", Issuer: "oidc.eks.eu-west-1.amazonaws.com/id/" + strings.ToUpper(cluster),
		EKSCluster: cluster,
	}
}

// sids lists the statement IDs of a document, in order.
func sids(t *testing.T, doc string) []string {
	t.Helper()
	d, err := parseDocument(doc)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, st := range asList(d["Statement"]) {
		out = append(out, sidOf(st))
	}
	return out
}

func TestMergeSharedKeepsEveryOtherStatement(t *testing.T) {
	west, east := sharedTrust("west", "team"), sharedTrust("east", "team")
	both := Parts{Annotation: true, Association: true}

	doc, err := MergeShared("", west, both)
	if err != nil {
		t.Fatal(err)
	}
	if got := sids(t, doc); len(got) != 2 || !sidPattern.MatchString(got[0]) || !sidPattern.MatchString(got[1]) {
		t.Fatalf("a new role's trust: statements %v, want the member's two", got)
	}
	// A statement written by hand, with elements the operator never writes, and the document's Id.
	var d map[string]any
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		t.Fatal(err)
	}
	d["Id"] = "kept"
	d["Statement"] = append(d["Statement"].([]any), map[string]any{
		"Sid": "BreakGlass", "Effect": "Allow", "Principal": map[string]any{"AWS": "arn:aws:iam::123456789012:root"},
		"Action": "sts:AssumeRole", "Condition": map[string]any{"Bool": map[string]any{"aws:MultiFactorAuthPresent": true}},
	})
	b, _ := json.Marshal(d)
	// IAM answers URL-encoded.
	doc, err = MergeShared(url.PathEscape(string(b)), east, Parts{Association: true})
	if err != nil {
		t.Fatal(err)
	}
	got := sids(t, doc)
	if len(got) != 4 || got[2] != "BreakGlass" {
		t.Fatalf("after east joined: %v, want west's two, BreakGlass, east's one", got)
	}
	if !strings.Contains(doc, `"Id":"kept"`) || !strings.Contains(doc, `"aws:MultiFactorAuthPresent":true`) {
		t.Errorf("other elements not kept as they were: %s", doc)
	}
	for _, want := range []string{
		`"aws:RequestTag/eks-cluster-name":"east"`, `"aws:RequestTag/kubernetes-namespace":"team"`,
		`"aws:RequestTag/kubernetes-service-account":"app"`, `"sts:TagSession"`,
		`"Federated":"arn:aws:iam::123456789012:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/WEST"`,
		`"oidc.eks.eu-west-1.amazonaws.com/id/WEST:sub":"system:serviceaccount:team:app"`,
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("merged trust lacks %s: %s", want, doc)
		}
	}

	// Holds: each member's own statements, whatever the others are.
	for _, c := range []struct {
		t     MemberTrust
		parts Parts
		want  bool
	}{
		{west, both, true}, {east, Parts{Association: true}, true},
		{west, Parts{Annotation: true}, false}, // west still has its Pod Identity statement
		{east, both, false},
		{sharedTrust("north", "team"), Parts{}, true}, // not a member: holds its absence
		{sharedTrust("north", "team"), Parts{Association: true}, false},
	} {
		if got, err := SharedTrustHolds(doc, c.t, c.parts); err != nil || got != c.want {
			t.Errorf("holds for %s %v = %v, %v; want %v", c.t.Member, c.parts, got, err, c.want)
		}
	}

	// West changes its mechanism, then leaves: only its statements change.
	doc2, err := MergeShared(doc, west, Parts{Association: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := sids(t, doc2); len(got) != 3 || got[0] != "BreakGlass" {
		t.Errorf("after west narrowed: %v", got)
	}
	doc3, err := MergeShared(doc2, west, Parts{})
	if err != nil {
		t.Fatal(err)
	}
	if got := sids(t, doc3); !slices.Equal(got, []string{"BreakGlass", east.Member.sid("PodIdentity")}) {
		t.Errorf("after west left: %v", got)
	}
}

func TestMergeSharedNeverLeavesAnEmptyPolicy(t *testing.T) {
	west := sharedTrust("west", "team")
	doc, _ := MergeShared("", west, Parts{Annotation: true})
	empty, err := MergeShared(doc, west, Parts{})
	if err != nil {
		t.Fatal(err)
	}
	// IAM refuses a trust policy without statements: the last member leaves one that admits nobody.
	if got := sids(t, empty); !slices.Equal(got, []string{nobodySid}) || !strings.Contains(empty, `"Effect":"Deny"`) {
		t.Fatalf("a policy every member left: %s", empty)
	}
	if m, _ := SharedMembers(empty, Member{}); len(m) != 0 {
		t.Errorf("members of the empty policy: %v", m)
	}
	// The next member's statement replaces it (a Deny would override its Allow).
	back, _ := MergeShared(empty, sharedTrust("east", "team"), Parts{Association: true})
	if got := sids(t, back); len(got) != 1 || got[0] == nobodySid {
		t.Errorf("a member joining the empty policy: %v", got)
	}
}

func TestMemberStatementIDs(t *testing.T) {
	a := Member{Cluster: "west", Namespace: "team", Name: "app"}
	seen := map[string]Member{}
	for _, m := range []Member{a, {"east", "team", "app"}, {"west", "team", "app2"}, {"west", "team2", "app"}} {
		for _, mech := range []string{"Irsa", "PodIdentity"} {
			sid := m.sid(mech)
			if !sidPattern.MatchString(sid) {
				t.Errorf("%s %s: sid %q is not a member's (IAM allows letters and digits only)", m, mech, sid)
			}
			if other, dup := seen[sid]; dup {
				t.Errorf("%s and %s share sid %s", m, other, sid)
			}
			seen[sid] = m
		}
	}
	if a.sid("Irsa") != (Member{Cluster: "west", Namespace: "team", Name: "app"}).sid("Irsa") {
		t.Error("a member's sid is not deterministic")
	}
}

func TestSharedMembersDescribeWhomTheyAdmit(t *testing.T) {
	west, east := sharedTrust("west", "team"), sharedTrust("east", "shop")
	doc, _ := MergeShared("", west, Parts{Annotation: true, Association: true})
	doc, _ = MergeShared(doc, east, Parts{Association: true})
	doc = strings.Replace(doc, `"Statement":[`, `"Statement":[{"Sid":"QuartermasterByHand","Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"},`, 1)
	got, err := SharedMembers(doc, east.Member)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"system:serviceaccount:team:app through oidc.eks.eu-west-1.amazonaws.com/id/WEST (IRSA)",
		"team/app in EKS cluster west (Pod Identity)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("members seen by east = %q, want %q", got, want)
	}
	if got, _ := SharedMembers(doc, west.Member); !slices.Equal(got, []string{"shop/app in EKS cluster east (Pod Identity)"}) {
		t.Errorf("members seen by west = %q", got)
	}
}

// TestOwnersWritesKeepOnlyListedMembers: the owner's merge drops the statements of members it does
// not list (and keeps its own, the listed ones' and hand-written ones); a member's merge drops no
// one else's.
func TestOwnersWritesKeepOnlyListedMembers(t *testing.T) {
	owner, listed, dropped := sharedTrust("west", "team"), sharedTrust("east", "team"), sharedTrust("east", "rogue")
	doc, _ := MergeShared("", owner, Parts{Annotation: true})
	doc, _ = MergeShared(doc, listed, Parts{Association: true})
	doc, _ = MergeShared(doc, dropped, Parts{Annotation: true, Association: true})
	doc = strings.Replace(doc, `"Statement":[`, `"Statement":[{"Sid":"BreakGlass","Effect":"Allow","Principal":{"AWS":"arn:aws:iam::123456789012:root"},"Action":"sts:AssumeRole"},`, 1)
	if n := len(sids(t, doc)); n != 5 {
		t.Fatalf("%d statements before the owner's write: %s", n, doc)
	}
	// A member's write leaves the others alone, listed or not.
	if same, _ := MergeShared(doc, listed, Parts{Association: true}); !slices.Equal(slices.Sorted(slices.Values(sids(t, same))), slices.Sorted(slices.Values(sids(t, doc)))) {
		t.Errorf("a member's write changed others' statements: %s", same)
	}
	owner.Owner, owner.Listed = true, []Member{listed.Member}
	if holds, err := SharedTrustHolds(doc, owner, Parts{Annotation: true}); err != nil || holds {
		t.Errorf("the owner's trust holds with an unlisted member's statements in it (err %v)", err)
	}
	pruned, err := MergeShared(doc, owner, Parts{Annotation: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"BreakGlass", listed.Member.sid("PodIdentity"), owner.Member.sid("Irsa")}
	if got := sids(t, pruned); !slices.Equal(got, want) {
		t.Errorf("after the owner's write: %q, want %q", got, want)
	}
	if holds, _ := SharedTrustHolds(pruned, owner, Parts{Annotation: true}); !holds {
		t.Error("the owner's trust does not hold after its own write")
	}
	foreign, err := ForeignStatements(pruned)
	if err != nil || !slices.Equal(foreign, []string{"BreakGlass"}) {
		t.Errorf("foreign statements = %q (%v), want BreakGlass", foreign, err)
	}
	if f, _ := ForeignStatements(strings.Replace(pruned, `,"Sid":"BreakGlass"`, "", 1)); !slices.Equal(f, []string{"a statement without Sid"}) {
		t.Errorf("a statement without Sid: %q", f)
	}
}

// TestMemberTags: the owner's list as tags, one per member under its digest; only the tag under a
// member's own key, naming it exactly, admits it.
func TestMemberTags(t *testing.T) {
	a, b := Member{"prod-eu", "payments", "app"}, Member{"prod-us", "payments", "app"}
	tags := MemberTags([]Member{a, b})
	if len(tags) != 2 || !Admits(tags, a) || !Admits(tags, b) || Admits(tags, Member{"prod-eu", "payments", "other"}) {
		t.Errorf("tags %v", tags)
	}
	for k, v := range tags {
		if !strings.HasPrefix(k, TagMemberPrefix) || len(k) > 128 || len(v) > 256 {
			t.Errorf("tag %s=%s does not fit IAM", k, v)
		}
	}
	if got := ListedMembers(map[string]string{TagSharedRole: "x", TagMemberPrefix + "1": "b/c/d", TagMemberPrefix + "0": "a/b/c"}); !slices.Equal(got, []string{"a/b/c", "b/c/d"}) {
		t.Errorf("listed = %q", got)
	}
	// A hand-written tag naming a member under another key admits nobody.
	if Admits(map[string]string{TagMemberPrefix + "0000000000000000": a.String()}, a) {
		t.Error("a tag under another key admitted its member")
	}
	with := MemberTags([]Member{a, b})
	with["Team"] = "payments"
	set, unset := MemberTagsDiff(with, []Member{b, {"prod-ap", "payments", "app"}})
	if len(set) != 1 || set[Member{"prod-ap", "payments", "app"}.memberTagKey()] != "prod-ap/payments/app" || !slices.Equal(unset, []string{a.memberTagKey()}) {
		t.Errorf("diff: set %v, unset %v", set, unset)
	}
	for _, bad := range []string{"a/b", "a/b/c/d", "/b/c", "a b/c/d"} {
		if _, err := ParseMember(bad); err == nil {
			t.Errorf("ParseMember(%q) accepted", bad)
		}
	}
	if m, err := ParseMember("eu_2:x+y@z=w/team-a/app.v2"); err != nil || m.Cluster != "eu_2:x+y@z=w" {
		t.Errorf("ParseMember: %+v %v", m, err)
	}
}
