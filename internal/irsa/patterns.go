package irsa

import (
	"fmt"
	"strings"
)

// Patterns are the operator's --allowed-policy-arns: globs of the existing managed policies
// (ManagedPolicyArns) a tenant may attach to its roles. Without a guard, any tenant could attach
// AdministratorAccess to a role its pods assume; the platform team lists what is safe, e.g.
// "arn:aws:iam::aws:policy/ReadOnlyAccess", "arn:aws:iam::aws:policy/*" or
// "arn:aws:iam::123456789012:policy/shared/*". In a pattern "*" matches any run of characters,
// "/" included (so "policy/*" covers policies under any path); every other character matches
// itself, case-sensitively, as ARNs compare. The zero value allows nothing.
type Patterns struct {
	patterns []string
}

// ParsePatterns checks the flag's entries: each must be a non-empty ARN pattern starting with
// "arn:" (surrounding spaces are trimmed, as in "a, b"). A typo such as a bare policy name is an
// error at start-up rather than a pattern that silently matches nothing.
func ParsePatterns(patterns []string) (Patterns, error) {
	var p Patterns
	for i, s := range patterns {
		s = strings.TrimSpace(s)
		if s == "" {
			return Patterns{}, fmt.Errorf("--allowed-policy-arns: entry %d is empty", i+1)
		}
		if !strings.HasPrefix(s, "arn:") {
			return Patterns{}, fmt.Errorf("--allowed-policy-arns: entry %d %q is not an ARN pattern (arn:…)", i+1, s)
		}
		p.patterns = append(p.patterns, s)
	}
	return p, nil
}

// Allows reports whether arn matches one of the patterns; false when there are none.
func (p Patterns) Allows(arn string) bool {
	for _, pat := range p.patterns {
		if glob(pat, arn) {
			return true
		}
	}
	return false
}

// String lists the patterns as the flag takes them, comma-separated, for logs and error messages
// ("… is not in --allowed-policy-arns (…)").
func (p Patterns) String() string { return strings.Join(p.patterns, ",") }

// glob matches s against pattern, where "*" matches any run of characters. It backtracks only to
// the last "*" seen, so it runs in O(len(pattern)·len(s)) at worst, whatever the input.
func glob(pattern, s string) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
