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
