package irsa

import (
	"regexp"
	"strings"
	"testing"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

func TestPath(t *testing.T) {
	if got, want := Path("prod-eu"), "/quartermaster/prod-eu/"; got != want {
		t.Fatalf("Path = %q, want %q", got, want)
	}
}

func TestValidClusterName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"prod-eu-1", true},
		{"Prod_EU.1:a=b+c@d", true},
		{strings.Repeat("c", 256), true},
		{"", false},
		{strings.Repeat("c", 257), false},
		{"a/b", false},
		{"a b", false},
		{"a!b", false}, // a path character, not a tag value character
		{"a\x7fb", false},
		{"é", false},
	} {
		err := ValidClusterName(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidClusterName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--cluster-name") {
			t.Errorf("ValidClusterName(%q) error %q does not name the flag", tc.name, err)
		}
		if err == nil && len(Path(tc.name)) > 512 {
			t.Errorf("Path(%q) is longer than IAM allows", tc.name)
		}
	}
}

var iamName = regexp.MustCompile(`^[\w+=,.@-]+$`)

func TestRoleName(t *testing.T) {
	for _, tc := range []struct {
		ns, sa, want string
	}{
		{"team-a", "app", "eks-sa-team-a-app"},
		{"a-b", "c", "eks-sa-a-b-c"},
		{"a", "b-c", "eks-sa-a-b-c"}, // same plain name as above: the tags decide ownership
		{"web.v1", "sa.with.dots", "eks-sa-web.v1-sa.with.dots"},
		// 64 characters: kept as is.
		{strings.Repeat("n", 20), strings.Repeat("s", 36), "eks-sa-" + strings.Repeat("n", 20) + "-" + strings.Repeat("s", 36)},
		// 83 characters: cut to 53 and a hash of "<ns>/<sa>" (golden: the hash must never change,
		// or every long-named role would be recreated under a new name).
		{"team-" + strings.Repeat("a", 40), strings.Repeat("s", 30), "eks-sa-team-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa--0d2450c809"},
	} {
		got := RoleName(tc.ns, tc.sa)
		if got != tc.want {
			t.Errorf("RoleName(%q, %q) = %q, want %q", tc.ns, tc.sa, got, tc.want)
		}
		if len(got) > MaxRoleName || !iamName.MatchString(got) {
			t.Errorf("RoleName(%q, %q) = %q is not a valid role name", tc.ns, tc.sa, got)
		}
	}

	// At the limit and one beyond.
	sa := strings.Repeat("s", MaxRoleName-len("eks-sa-ns-"))
	if got := RoleName("ns", sa); len(got) != MaxRoleName || !strings.HasSuffix(got, sa) {
		t.Errorf("RoleName at 64 = %q, want the plain name", got)
	}
	got := RoleName("ns", sa+"x")
	if len(got) != MaxRoleName || strings.HasSuffix(got, "sx") || !regexp.MustCompile(`-[0-9a-f]{10}$`).MatchString(got) {
		t.Errorf("RoleName at 65 = %q, want 64 characters ending in a hash", got)
	}
}

// TestRoleDescription: the description says the mechanism; an IRSA role's (also an object written
// before spec.mechanism existed) is the one roles always had, so upgrading rewrites none of them.
func TestRoleDescription(t *testing.T) {
	for m, want := range map[iamv1alpha1.Mechanism]string{
		iamv1alpha1.MechanismIRSA:        "IRSA role of ServiceAccount team-a/app (Quartermaster)",
		"":                               "IRSA role of ServiceAccount team-a/app (Quartermaster)",
		iamv1alpha1.MechanismPodIdentity: "EKS Pod Identity role of ServiceAccount team-a/app (Quartermaster)",
		iamv1alpha1.MechanismBoth:        "IRSA and EKS Pod Identity role of ServiceAccount team-a/app (Quartermaster)",
	} {
		if got := RoleDescription(m, "team-a", "app"); got != want {
			t.Errorf("RoleDescription(%q) = %q, want %q", m, got, want)
		}
	}
}

func TestRoleNameUnique(t *testing.T) {
	// Long names that share everything up to the cut, and pairs that split the same string
	// differently, must all get different names.
	ns := strings.Repeat("n", 63)
	seen := map[string]string{}
	add := func(ns, sa string) {
		got := RoleName(ns, sa)
		if prev, ok := seen[got]; ok {
			t.Fatalf("RoleName(%q, %q) = %q, same as for %s", ns, sa, got, prev)
		}
		seen[got] = ns + "/" + sa
	}
	for i := range 200 {
		add(ns, strings.Repeat("s", 60)+strings.Repeat("x", i%7)+string(rune('a'+i%26))+strings.Repeat("y", i/26))
	}
	long := strings.Repeat("ab", 50)
	for i := 1; i < len(long)-1; i++ {
		add(long[:i], long[i:]+"-z")
	}
}

func TestPolicyName(t *testing.T) {
	for _, tc := range []struct {
		ns, name, want string
	}{
		{"team-a", "s3-read", "team-a-s3-read"},
		{strings.Repeat("n", 63), strings.Repeat("p", 64), strings.Repeat("n", 63) + "-" + strings.Repeat("p", 64)}, // 128
		{strings.Repeat("n", 63), strings.Repeat("p", 70), strings.Repeat("n", 63) + "-" + strings.Repeat("p", 53) + "-d916449408"},
	} {
		got := PolicyName(tc.ns, tc.name)
		if got != tc.want {
			t.Errorf("PolicyName(%q, %q) = %q, want %q", tc.ns, tc.name, got, tc.want)
		}
		if len(got) > MaxPolicyName || !iamName.MatchString(got) {
			t.Errorf("PolicyName(%q, %q) = %q is not a valid policy name", tc.ns, tc.name, got)
		}
	}
	if PolicyName("a", strings.Repeat("p", 200)) == PolicyName("a", strings.Repeat("p", 201)) {
		t.Error("long policy names that differ only beyond the cut collide")
	}
}

func TestTagsAndOwnedBy(t *testing.T) {
	tags := Tags("prod", "team-a", "app")
	want := map[string]string{TagCluster: "prod", TagNamespace: "team-a", TagName: "app"}
	if len(tags) != 3 || tags[TagCluster] != "prod" || tags[TagNamespace] != "team-a" || tags[TagName] != "app" {
		t.Fatalf("Tags = %v, want %v", tags, want)
	}
	tags["extra"] = "x" // a new map each time: callers may add to it
	if len(Tags("prod", "team-a", "app")) != 3 {
		t.Fatal("Tags returns a shared map")
	}
	withOther := map[string]string{TagCluster: "prod", TagNamespace: "team-a", TagName: "app", "Owner": "someone"}
	for _, tc := range []struct {
		name string
		tags map[string]string
		want bool
	}{
		{"exact", want, true},
		{"extra tags are fine", withOther, true},
		{"nil", nil, false},
		{"untagged", map[string]string{}, false},
		{"other cluster", map[string]string{TagCluster: "dev", TagNamespace: "team-a", TagName: "app"}, false},
		{"other namespace", map[string]string{TagCluster: "prod", TagNamespace: "team-b", TagName: "app"}, false},
		{"other name", map[string]string{TagCluster: "prod", TagNamespace: "team-a", TagName: "app2"}, false},
		{"missing name", map[string]string{TagCluster: "prod", TagNamespace: "team-a"}, false},
	} {
		if got := OwnedBy(tc.tags, "prod", "team-a", "app"); got != tc.want {
			t.Errorf("%s: OwnedBy = %v, want %v", tc.name, got, tc.want)
		}
	}
	if OwnedBy(map[string]string{TagCluster: "prod", TagNamespace: "team-a"}, "prod", "team-a", "") {
		t.Error("a missing tag matches an empty name")
	}
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func FuzzRoleName(f *testing.F) {
	f.Add("team-a", "app")
	f.Add("a-b", "c")
	f.Add(strings.Repeat("n", 63), strings.Repeat("s", 253))
	f.Add("kube-system", "aws-load-balancer-controller")
	f.Add("x", "a.b.c")
	f.Add("", "")
	f.Add("ns", "ü/ß")
	f.Fuzz(func(t *testing.T, ns, sa string) {
		got := RoleName(ns, sa)
		if len(got) > MaxRoleName {
			t.Fatalf("RoleName(%q, %q) = %q: %d characters", ns, sa, got, len(got))
		}
		if got != RoleName(ns, sa) {
			t.Fatalf("RoleName(%q, %q) is not deterministic", ns, sa)
		}
		if len("eks-sa-"+ns+"-"+sa) <= MaxRoleName && got != "eks-sa-"+ns+"-"+sa {
			t.Fatalf("RoleName(%q, %q) = %q: shortened a name that fits", ns, sa, got)
		}
		// Random strings are rarely DNS names: also check the DNS names made from them.
		dns, dnsSA := strings.ReplaceAll(dnsName(ns, 63), ".", "-"), dnsName(sa, 253)
		if !dnsLabel.MatchString(dns) || !dnsSubdomain.MatchString(dnsSA) {
			t.Fatalf("test helper: dnsName gave %q, %q", dns, dnsSA)
		}
		if got := RoleName(dns, dnsSA); len(got) > MaxRoleName || !iamName.MatchString(got) {
			t.Fatalf("RoleName(%q, %q) = %q is not a valid role name", dns, dnsSA, got)
		}
	})
}

// dnsName maps any string to a DNS subdomain of at most maxLen characters.
func dnsName(s string, maxLen int) string {
	var b strings.Builder
	for _, c := range strings.ToLower(s) {
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '.':
			b.WriteRune(c)
		default:
			b.WriteByte(byte('a' + c%26))
		}
	}
	out := b.String()
	if len(out) > maxLen {
		out = out[:maxLen]
	}
	for strings.Contains(out, "..") || strings.Contains(out, ".-") || strings.Contains(out, "-.") {
		out = strings.NewReplacer("..", ".x", ".-", ".x", "-.", "x.").Replace(out)
	}
	out = strings.Trim(out, "-.")
	if out == "" {
		return "x"
	}
	return out
}

func TestAdoption(t *testing.T) {
	for value, want := range map[string]string{"true": Path("c1"), "/": "/", "/legacy/team-a/": "/legacy/team-a/"} {
		if got, ok := AdoptPath(value, "c1"); !ok || got != want {
			t.Errorf("AdoptPath(%q) = %q, %v; want %q", value, got, ok, want)
		}
	}
	for _, value := range []string{"", "yes", "legacy/", "/legacy", "//", "/a b/", "/" + strings.Repeat("a", 511) + "/"} {
		if got, ok := AdoptPath(value, "c1"); ok {
			t.Errorf("AdoptPath(%q) = %q, accepted", value, got)
		}
	}
	if TaggedByQuartermaster(map[string]string{"team": "a"}) || !TaggedByQuartermaster(map[string]string{TagCluster: "other"}) ||
		!TaggedByQuartermaster(map[string]string{TagName: ""}) {
		t.Error("TaggedByQuartermaster must see any one of the three tags, and nothing else")
	}
}
