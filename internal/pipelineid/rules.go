package pipelineid

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Rule admits the tokens whose claims match, and names the namespace they may have.
type Rule struct {
	// Claims maps a claim to the patterns one of which its value must match (* matches any run of
	// characters, / included); every claim listed must match. A claim the token lacks, or that is
	// not a string (or a boolean, read as "true"/"false"), matches nothing.
	Claims map[string][]string
	// Namespace is the template of the namespace name: text and {claim} or {claim|transform}
	// (transforms: last, the part after the last "/"; pull, the number of a GitHub pull request
	// ref refs/pull/N/…). Each value is lower-cased and every run of characters other than a-z,
	// 0-9 and "-" becomes one "-"; the whole must be a DNS label (≤ 63 characters), else the token
	// is refused — a name is never cut, so two identities cannot be shortened into one.
	Namespace string
}

// placeholder is one {claim} or {claim|transform} of a template.
var placeholder = regexp.MustCompile(`\{([A-Za-z0-9_.:-]+)(?:\|([a-z]+))?\}`)

// transforms are what a placeholder may apply to its claim.
var transforms = map[string]func(string) (string, bool){
	"":     func(s string) (string, bool) { return s, true },
	"last": func(s string) (string, bool) { return s[strings.LastIndexByte(s, '/')+1:], true },
	"pull": func(s string) (string, bool) {
		rest, ok := strings.CutPrefix(s, "refs/pull/")
		if !ok {
			return "", false
		}
		n, _, _ := strings.Cut(rest, "/")
		if _, err := strconv.ParseUint(n, 10, 32); err != nil {
			return "", false
		}
		return n, true
	},
}

// ValidateTemplate checks a namespace template: its placeholders and transforms are known, and
// the text around them is made of what a name may hold.
func ValidateTemplate(tmpl string) error {
	if tmpl == "" {
		return fmt.Errorf("the namespace template is empty")
	}
	for _, m := range placeholder.FindAllStringSubmatch(tmpl, -1) {
		if _, ok := transforms[m[2]]; !ok {
			return fmt.Errorf("{%s|%s}: unknown transform %q (last, pull)", m[1], m[2], m[2])
		}
	}
	text := placeholder.ReplaceAllString(tmpl, "")
	if strings.ContainsAny(text, "{}") {
		return fmt.Errorf("%q has a brace that is not a placeholder ({claim} or {claim|transform})", tmpl)
	}
	for _, r := range text {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return fmt.Errorf("%q has %q outside a placeholder: a namespace name holds only a-z, 0-9 and -", tmpl, r)
		}
	}
	return nil
}

// claimString is a claim's value as rules and templates read it.
func claimString(claims map[string]any, name string) (string, bool) {
	switch v := claims[name].(type) {
	case string:
		return v, true
	case bool:
		return strconv.FormatBool(v), true
	}
	return "", false
}

// Match returns the index of the first rule whose claims all match, or a refusal that lists the
// values of the claims the rules look at (claims are not secret; the token is never shown).
func Match(claims map[string]any, rules []Rule) (int, error) {
	for i, r := range rules {
		if matches(claims, r.Claims) {
			return i, nil
		}
	}
	var looked []string
	for _, r := range rules {
		for name := range r.Claims {
			looked = append(looked, name)
		}
	}
	slices.Sort(looked)
	looked = slices.Compact(looked)
	var seen []string
	for _, name := range looked {
		if v, ok := claimString(claims, name); ok {
			seen = append(seen, fmt.Sprintf("%s=%q", name, v))
		} else {
			seen = append(seen, name+" missing")
		}
	}
	return -1, refuse(CheckClaims, "no rule admits the token's claims (%s)", strings.Join(seen, ", "))
}

func matches(claims map[string]any, want map[string][]string) bool {
	for name, patterns := range want {
		v, ok := claimString(claims, name)
		if !ok || !slices.ContainsFunc(patterns, func(p string) bool { return Glob(p, v) }) {
			return false
		}
	}
	return true
}

// Glob reports whether s matches pattern, where * matches any run of characters (including "/";
// a pattern without * must equal s).
func Glob(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, parts[len(parts)-1])
}

// NamespaceName renders a rule's template with the claims. A claim that is missing, a transform
// that does not apply, or a result that is no DNS label is a refusal naming it.
func NamespaceName(tmpl string, claims map[string]any) (string, error) {
	var failed error
	name := placeholder.ReplaceAllStringFunc(tmpl, func(ph string) string {
		m := placeholder.FindStringSubmatch(ph)
		v, ok := claimString(claims, m[1])
		if !ok {
			failed = refuse(CheckName, "the namespace template needs claim %s, which the token lacks", m[1])
			return ""
		}
		out, ok := transforms[m[2]](v)
		if !ok {
			failed = refuse(CheckName, "claim %s=%q has no %s part (template %s)", m[1], v, m[2], tmpl)
			return ""
		}
		return label(out)
	})
	if failed != nil {
		return "", failed
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return "", refuse(CheckName, "the claims make %q of template %s, which is no namespace name (%s); names are never cut, so that two identities cannot be shortened into one",
			name, tmpl, strings.Join(errs, "; "))
	}
	return name, nil
}

// label maps a claim's value into what a namespace name holds: lower case, and every run of other
// characters one "-".
func label(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	return b.String()
}
