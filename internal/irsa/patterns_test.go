package irsa

import (
	"strings"
	"testing"
)

func TestParsePatterns(t *testing.T) {
	for _, tc := range []struct {
		in     []string
		want   string // String(); "" with err
		errSub string
	}{
		{nil, "", ""},
		{[]string{"arn:aws:iam::aws:policy/ReadOnlyAccess"}, "arn:aws:iam::aws:policy/ReadOnlyAccess", ""},
		{[]string{"arn:aws:iam::aws:policy/*", " arn:aws:iam::123456789012:policy/shared/* "}, "arn:aws:iam::aws:policy/*,arn:aws:iam::123456789012:policy/shared/*", ""},
		{[]string{"arn:aws:iam::aws:policy/*", ""}, "", "entry 2 is empty"},
		{[]string{"  "}, "", "entry 1 is empty"},
		{[]string{"ReadOnlyAccess"}, "", `"ReadOnlyAccess" is not an ARN`},
		{[]string{"*"}, "", "not an ARN"},
		{[]string{"ARN:aws:iam::aws:policy/x"}, "", "not an ARN"},
	} {
		p, err := ParsePatterns(tc.in)
		if tc.errSub != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errSub) || !strings.Contains(err.Error(), "--allowed-policy-arns") {
				t.Errorf("ParsePatterns(%q) = %v, %v; want an error with %q", tc.in, p, err, tc.errSub)
			}
			continue
		}
		if err != nil || p.String() != tc.want {
			t.Errorf("ParsePatterns(%q) = %q, %v; want %q", tc.in, p.String(), err, tc.want)
		}
	}
}

func TestPatternsAllows(t *testing.T) {
	p, err := ParsePatterns([]string{
		"arn:aws:iam::aws:policy/ReadOnlyAccess",
		"arn:aws:iam::aws:policy/service-role/*",
		"arn:aws:iam::123456789012:policy/shared/*",
		"arn:aws:iam::*:policy/team-*-read",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		arn  string
		want bool
	}{
		{"arn:aws:iam::aws:policy/ReadOnlyAccess", true},
		{"arn:aws:iam::aws:policy/ReadOnlyAccessX", false},
		{"arn:aws:iam::aws:policy/readonlyaccess", false}, // ARNs are case-sensitive
		{"arn:aws:iam::aws:policy/AdministratorAccess", false},
		{"arn:aws:iam::aws:policy/service-role/AmazonEC2RoleforSSM", true},
		{"arn:aws:iam::aws:policy/service-role/deeper/path/X", true}, // "*" crosses "/"
		{"arn:aws:iam::aws:policy/service-role/", true},              // "*" matches nothing too
		{"arn:aws:iam::123456789012:policy/shared/a/b", true},
		{"arn:aws:iam::123456789012:policy/sharedX", false},
		{"arn:aws:iam::210987654321:policy/shared/a", false},
		{"arn:aws:iam::111111111111:policy/team-a-read", true},
		{"arn:aws:iam::111111111111:policy/team-a-b-read", true},
		{"arn:aws:iam::111111111111:policy/team-a-read-write", false},
		{"", false},
	} {
		if got := p.Allows(tc.arn); got != tc.want {
			t.Errorf("Allows(%q) = %v, want %v", tc.arn, got, tc.want)
		}
	}
	var none Patterns
	if none.Allows("arn:aws:iam::aws:policy/ReadOnlyAccess") || none.String() != "" {
		t.Error("the zero Patterns allows something")
	}
	empty, _ := ParsePatterns(nil)
	if empty.Allows("") {
		t.Error("no patterns allow the empty string")
	}
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"", "", true},
		{"", "a", false},
		{"*", "", true},
		{"*", "anything/at/all", true},
		{"a*", "a", true},
		{"a*b", "axxb", true},
		{"a*b", "axxbx", false},
		{"a*b*c", "abbbcbc", true},
		{"a**b", "ab", true},
		{"a?b", "axb", false}, // only "*" is special
		{"a?b", "a?b", true},
		{"*x", strings.Repeat("a", 10000), false},
		{strings.Repeat("*a", 50) + "b", strings.Repeat("a", 5000), false}, // no exponential backtracking
	} {
		if got := glob(tc.pattern, tc.s); got != tc.want {
			t.Errorf("glob(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}
