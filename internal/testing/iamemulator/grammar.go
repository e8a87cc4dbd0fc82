package iamemulator

import (
	"encoding/json"
	"regexp"
	"strings"
)

// docKind says which grammar a policy document follows: identity policies name no principal and
// need resources; trust policies (a role's AssumeRolePolicyDocument) need a principal and name no
// resource.
type docKind int

const (
	identityPolicy docKind = iota
	trustPolicy
)

// conditionOperator matches IAM's condition operators, with the set-operator prefixes and the
// IfExists suffix (which Null does not take).
var conditionOperator = regexp.MustCompile(`^(ForAllValues:|ForAnyValue:)?(` +
	`(String(Not)?Equals(IgnoreCase)?|String(Not)?Like|` +
	`Numeric(Not)?Equals|NumericLessThan(Equals)?|NumericGreaterThan(Equals)?|` +
	`Date(Not)?Equals|DateLessThan(Equals)?|DateGreaterThan(Equals)?|` +
	`Bool|BinaryEquals|(Not)?IpAddress|Arn(Not)?Equals|Arn(Not)?Like)(IfExists)?|Null)$`)

// vendorPrefixed is an action with its service prefix ("s3:GetObject"); conditionKey a condition
// key with its prefix ("aws:SourceIp", or an OIDC provider's "oidc.example.com/id/X:sub").
var (
	vendorPrefixed = regexp.MustCompile(`^[A-Za-z0-9-]+:.+$`)
	conditionKey   = regexp.MustCompile(`^[^:]+:.+$`)
)

// validateStatements checks what real IAM checks in each statement, with its messages.
func validateStatements(raw json.RawMessage, kind docKind) *apiError {
	var stmts []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &stmts); err != nil {
		var one map[string]json.RawMessage
		if err := json.Unmarshal(raw, &one); err != nil {
			return malformed("Statement must be an object or a list of objects.")
		}
		stmts = []map[string]json.RawMessage{one}
	}
	for _, s := range stmts {
		var effect string
		if err := json.Unmarshal(s["Effect"], &effect); err != nil || (effect != "Allow" && effect != "Deny") {
			return malformed("Invalid effect: %s", strings.Trim(string(s["Effect"]), `"`))
		}
		_, action := s["Action"]
		_, notAction := s["NotAction"]
		if !action && !notAction {
			return malformed("Policy statement must contain actions.")
		}
		for _, key := range []string{"Action", "NotAction"} {
			for _, a := range stringsOf(s[key]) {
				if a != "*" && !vendorPrefixed.MatchString(a) {
					return malformed("Actions/Conditions must be prefaced by a vendor, e.g., iam, sdb, ec2, etc.")
				}
			}
		}
		_, principal := s["Principal"]
		_, notPrincipal := s["NotPrincipal"]
		_, resource := s["Resource"]
		_, notResource := s["NotResource"]
		switch kind {
		case identityPolicy:
			if principal || notPrincipal {
				return malformed("Policy document should not specify a principal.")
			}
			if !resource && !notResource {
				return malformed("Policy statement must contain resources.")
			}
			for _, key := range []string{"Resource", "NotResource"} {
				for _, r := range stringsOf(s[key]) {
					if r != "*" && len(strings.SplitN(r, ":", 6)) < 6 {
						return malformed("Resource %s must be in ARN format or \"*\".", r)
					}
				}
			}
		case trustPolicy:
			if !principal && !notPrincipal {
				return malformed("Missing required field Principal")
			}
			if resource || notResource {
				return malformed("Has prohibited field Resource")
			}
		}
		if c, ok := s["Condition"]; ok {
			var cond map[string]map[string]json.RawMessage
			if err := json.Unmarshal(c, &cond); err != nil {
				return malformed("Syntax errors in policy.")
			}
			for op, keys := range cond {
				if !conditionOperator.MatchString(op) {
					return malformed("Invalid Condition type : %s", op)
				}
				for k := range keys {
					if !conditionKey.MatchString(k) {
						return malformed("Actions/Conditions must be prefaced by a vendor, e.g., iam, sdb, ec2, etc.")
					}
				}
			}
		}
	}
	return nil
}

// stringsOf reads a string or a list of strings; anything else gives nothing.
func stringsOf(raw json.RawMessage) []string {
	if len(raw) == 0 {
		return nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}
	}
	var many []string
	_ = json.Unmarshal(raw, &many)
	return many
}
