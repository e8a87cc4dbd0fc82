package irsa

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
)

// jsonSpace is the whitespace JSON allows between tokens (strings.TrimSpace trims more).
const jsonSpace = " \t\r\n"

// Equivalent reports whether two policy documents mean the same to IAM, so that the controller
// writes a new policy version (or trust policy) only when the meaning changed. Comparing bytes is
// not enough: IAM returns documents URL-encoded, with its own key order and whitespace, and keeps
// "Action": "s3:GetObject" where the controller renders ["s3:GetObject"]; a byte comparison would
// write a new version on every reconcile and soon hit the limit of five.
//
// Each side is raw JSON or URL-encoded JSON, as IAM returns it (anything that does not start with
// "{" is percent-decoded first, RFC 3986 style: "+" stays "+"). Both are brought to a canonical form and compared:
//
//   - key order and whitespace do not matter;
//   - a missing Version means "2008-10-17" (as in IAM), so it equals an explicit "2008-10-17" but
//     not "2012-10-17", under which policy variables mean something else;
//   - Statement as one object equals a list of one, and statements compare as a multiset (order
//     does not matter);
//   - in a statement, a single string equals a one-element list for Action, NotAction, Resource,
//     NotResource, principals and condition values, and these lists compare as sets (order and
//     duplicates do not matter);
//   - action names compare case-insensitively, as IAM matches them; resource ARNs and principals
//     case-sensitively;
//   - Principal/NotPrincipal compare as sets of strings per principal type; the string "*" is kept
//     as it is (it is not the same as {"AWS": "*"} here);
//   - condition operators compare case-sensitively, condition keys case-insensitively (as IAM
//     evaluates them), and condition values as sets of strings, where a JSON number or boolean
//     equals its string form (IAM compares condition values as strings: true and "true" are one);
//   - all other elements compare exactly, lists in order.
//
// Equivalent is an equivalence relation (reflexive, symmetric, transitive), since it compares
// canonical forms. It returns an error, naming the side, when either side is not a JSON object.
func Equivalent(a, b string) (bool, error) {
	ca, err := canonicalDocument(a)
	if err != nil {
		return false, fmt.Errorf("first policy document: %w", err)
	}
	cb, err := canonicalDocument(b)
	if err != nil {
		return false, fmt.Errorf("second policy document: %w", err)
	}
	return ca == cb, nil
}

// parseDocument decodes a raw or URL-encoded JSON object, numbers kept as written.
func parseDocument(s string) (map[string]any, error) {
	t := strings.TrimLeft(s, jsonSpace)
	if !strings.HasPrefix(t, "{") {
		u, err := url.PathUnescape(s)
		if err != nil {
			return nil, errors.New("neither JSON nor URL-encoded JSON")
		}
		t = u
	}
	dec := json.NewDecoder(strings.NewReader(t))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("not valid JSON: data after the object")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("not a JSON object")
	}
	return m, nil
}

// canonicalDocument returns the canonical form of a policy document as compact JSON with sorted keys.
func canonicalDocument(s string) (string, error) {
	m, err := parseDocument(s)
	if err != nil {
		return "", err
	}
	out := make(map[string]any, len(m)+1)
	for k, v := range m {
		if k == "Statement" {
			out[k] = canonicalList(asList(v), canonicalStatement, false)
		} else {
			out[k] = exact(v)
		}
	}
	if _, ok := m["Version"]; !ok {
		out["Version"] = version2008
	}
	return marshal(out)
}

func canonicalStatement(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return exact(v)
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		switch k {
		case "Action", "NotAction":
			out[k] = canonicalList(asList(v), lowerString, true)
		case "Resource", "NotResource":
			out[k] = canonicalList(asList(v), exact, true)
		case "Principal", "NotPrincipal":
			out[k] = canonicalPrincipal(v)
		case "Condition":
			out[k] = canonicalCondition(v)
		default:
			out[k] = exact(v)
		}
	}
	return out
}

// canonicalPrincipal: {"AWS": "arn"} equals {"AWS": ["arn"]}; a string ("*") stays a string.
func canonicalPrincipal(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return exact(v)
	}
	out := make(map[string]any, len(m))
	for typ, ids := range m {
		out[typ] = canonicalList(asList(ids), exact, true)
	}
	return out
}

// canonicalCondition lower-cases condition keys, merging the values of keys that differ only in
// case (IAM treats them as one key), and compares values as sets of strings.
func canonicalCondition(v any) any {
	ops, ok := v.(map[string]any)
	if !ok {
		return exact(v)
	}
	out := make(map[string]any, len(ops))
	for op, kv := range ops {
		m, ok := kv.(map[string]any)
		if !ok {
			out[op] = exact(kv)
			continue
		}
		values := make(map[string][]any, len(m))
		for k, vs := range m {
			lk := strings.ToLower(k)
			values[lk] = append(values[lk], asList(vs)...)
		}
		c := make(map[string]any, len(values))
		for k, vs := range values {
			c[k] = canonicalList(vs, conditionValue, true)
		}
		out[op] = c
	}
	return out
}

// conditionValue is a condition value as IAM compares it: a string, numbers and booleans as written.
func conditionValue(v any) any {
	switch v := v.(type) {
	case json.Number:
		return string(v)
	case bool:
		if v {
			return "true"
		}
		return "false"
	}
	return exact(v)
}

func lowerString(v any) any {
	if s, ok := v.(string); ok {
		return strings.ToLower(s)
	}
	return exact(v)
}

// asList treats a single value as a list of one, as IAM does where it allows either.
func asList(v any) []any {
	if l, ok := v.([]any); ok {
		return l
	}
	return []any{v}
}

// canonicalList canonicalizes each element and sorts them by their JSON form, dropping duplicates
// when set (a set of actions, resources, values), keeping them otherwise (a multiset of statements).
func canonicalList(l []any, canon func(any) any, set bool) []any {
	keys := make([]string, 0, len(l))
	for _, v := range l {
		s, err := marshal(canon(v))
		if err != nil { // decoded JSON always marshals
			panic("irsa: marshal canonical value: " + err.Error())
		}
		keys = append(keys, s)
	}
	slices.Sort(keys)
	if set {
		keys = slices.Compact(keys)
	}
	out := make([]any, len(keys))
	for i, k := range keys {
		out[i] = json.RawMessage(k)
	}
	return out
}

// exact is the canonical form of a value with no policy meaning attached: itself. Objects need no
// sorting (their keys marshal sorted), and lists keep their order.
func exact(v any) any { return v }
