package iamemulator

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

const timeLayout = "2006-01-02T15:04:05Z"

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

// apiError is an IAM error answered as <ErrorResponse>.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.code + ": " + e.msg }

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func noSuchEntity(format string, args ...any) *apiError {
	return errorf(http.StatusNotFound, "NoSuchEntity", format, args...)
}

func deleteConflict(format string, args ...any) *apiError {
	return errorf(http.StatusConflict, "DeleteConflict", format, args...)
}

func limitExceeded(format string, args ...any) *apiError {
	return errorf(http.StatusConflict, "LimitExceeded", format, args...)
}

func alreadyExists(format string, args ...any) *apiError {
	return errorf(http.StatusConflict, "EntityAlreadyExists", format, args...)
}

func invalidInput(format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, "InvalidInput", format, args...)
}

func validationError(format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, "ValidationError", format, args...)
}

func malformed(format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, "MalformedPolicyDocument", format, args...)
}

func accessDenied(account, action, arn string) *apiError {
	return errorf(http.StatusForbidden, "AccessDenied",
		"User: arn:aws:iam::%s:user/emulator is not authorized to perform: iam:%s on resource: policy %s",
		account, action, arn)
}

func writeResult(w http.ResponseWriter, ns, action, requestID string, result any) {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, `<%sResponse xmlns="%s">`, action, ns)
	if result != nil {
		enc := xml.NewEncoder(&buf)
		if err := enc.EncodeElement(result, xml.StartElement{Name: xml.Name{Local: action + "Result"}}); err != nil {
			http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
			return
		}
		if err := enc.Flush(); err != nil {
			http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	fmt.Fprintf(&buf, `<ResponseMetadata><RequestId>%s</RequestId></ResponseMetadata></%sResponse>`, requestID, action)
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.Header().Set("X-Amzn-Requestid", requestID)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) writeError(w http.ResponseWriter, ns, requestID string, e *apiError) {
	typ := "Sender"
	if e.status >= 500 {
		typ = "Receiver"
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, `<ErrorResponse xmlns="%s"><Error><Type>%s</Type><Code>%s</Code><Message>`, ns, typ, e.code)
	_ = xml.EscapeText(&buf, []byte(e.msg))
	fmt.Fprintf(&buf, `</Message></Error><RequestId>%s</RequestId></ErrorResponse>`, requestID)
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.Header().Set("X-Amzn-Requestid", requestID)
	w.WriteHeader(e.status)
	_, _ = w.Write(buf.Bytes())
}

// encodeDocument percent-encodes a policy document the way real IAM returns it
// (RFC 3986 style: spaces are %20, not +).
func encodeDocument(doc string) string {
	return strings.ReplaceAll(url.QueryEscape(doc), "+", "%20")
}

// params are the decoded form fields of a Query request.
type params url.Values

func (p params) get(name string) string { return url.Values(p).Get(name) }

func (p params) has(name string) bool { return url.Values(p).Has(name) }

func (p params) required(name string) (string, *apiError) {
	v := p.get(name)
	if v == "" {
		return "", validationError("1 validation error detected: Value null at '%s' failed to satisfy constraint: Member must not be null", lowerFirst(name))
	}
	return v, nil
}

func (p params) boolean(name string) bool {
	b, _ := strconv.ParseBool(p.get(name))
	return b
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

const (
	maxRoleNameLen   = 64
	maxPolicyNameLen = 128
	maxTagKeyLen     = 128
	maxTagValueLen   = 256
)

var (
	nameRE   = regexp.MustCompile(`^[\w+=,.@-]+$`)
	pathRE   = regexp.MustCompile(`^/([\x21-\x7E]*/)?$`)
	tagKeyRE = regexp.MustCompile(`^[\p{L}\p{Z}\p{N}_.:/=+\-@]+$`)
)

// checkName validates a role or policy name like IAM: a length constraint, then the
// pattern [\w+=,.@-]+, each failing with its own ValidationError message.
func checkName(field, value string, maxLen int) *apiError {
	if len(value) > maxLen {
		return validationError("1 validation error detected: Value '%s' at '%s' failed to satisfy constraint: Member must have length less than or equal to %d",
			value, lowerFirst(field), maxLen)
	}
	if !nameRE.MatchString(value) {
		return validationError("1 validation error detected: Value '%s' at '%s' failed to satisfy constraint: Member must satisfy regular expression pattern: [\\w+=,.@-]+",
			value, lowerFirst(field))
	}
	return nil
}

// path returns the Path parameter, "/" by default, validated like IAM does.
func (p params) path(name string) (string, *apiError) {
	v := p.get(name)
	if v == "" {
		return "/", nil
	}
	if len(v) > 512 || !pathRE.MatchString(v) {
		return "", validationError("The specified value for %s is invalid. It must begin and end with / and contain only alphanumeric characters and/or / characters.", lowerFirst(name))
	}
	return v, nil
}

func (p params) description() (string, *apiError) {
	v := p.get("Description")
	if len(v) > 1000 {
		return "", validationError("1 validation error detected: Value at 'description' failed to satisfy constraint: Member must have length less than or equal to 1000")
	}
	return v, nil
}

// maxSessionDuration returns the MaxSessionDuration parameter, or def when absent.
func (p params) maxSessionDuration(def int) (int, *apiError) {
	if !p.has("MaxSessionDuration") {
		return def, nil
	}
	n, err := strconv.Atoi(p.get("MaxSessionDuration"))
	if err != nil || n < 3600 || n > 43200 {
		return 0, validationError("1 validation error detected: Value '%s' at 'maxSessionDuration' failed to satisfy constraint: Member must have value between 3600 and 43200", p.get("MaxSessionDuration"))
	}
	return n, nil
}

// Tag is an IAM tag.
type Tag struct {
	Key   string `xml:"Key" json:"key"`
	Value string `xml:"Value" json:"value"`
}

const maxTags = 50

// tags parses Tags.member.N.Key/Value and validates them like IAM: key and value lengths
// and the key pattern (ValidationError), reserved aws: keys and duplicate keys (InvalidInput).
// Tag values are not matched against IAM's pattern, so tests can exercise XML escaping.
// entity is what CreatePolicy and CreateRole both take first, checked as IAM checks it.
type entity struct {
	name, path, document, description string
}

// newEntity reads and checks the name, Path, document and Description of a creation, in IAM's order.
func (p params) newEntity(nameParam string, maxName int, docParam string, kind docKind, quotaName string, quota int) (entity, *apiError) {
	var e entity
	var err *apiError
	if e.name, err = p.required(nameParam); err != nil {
		return e, err
	}
	if err := checkName(nameParam, e.name, maxName); err != nil {
		return e, err
	}
	if e.path, err = p.path("Path"); err != nil {
		return e, err
	}
	if e.document, err = p.required(docParam); err != nil {
		return e, err
	}
	if err := validateDocument(e.document, kind, quotaName, quota); err != nil {
		return e, err
	}
	e.description, err = p.description()
	return e, err
}

func (p params) tags() ([]Tag, *apiError) {
	var out []Tag
	for i := 1; ; i++ {
		prefix := "Tags.member." + strconv.Itoa(i)
		if !p.has(prefix + ".Key") {
			break
		}
		t := Tag{Key: p.get(prefix + ".Key"), Value: p.get(prefix + ".Value")}
		field := "tags." + strconv.Itoa(i) + ".member"
		switch {
		case utf8.RuneCountInString(t.Key) > maxTagKeyLen:
			return nil, validationError("1 validation error detected: Value '%s' at '%s.key' failed to satisfy constraint: Member must have length less than or equal to %d", t.Key, field, maxTagKeyLen)
		case !tagKeyRE.MatchString(t.Key):
			return nil, validationError("1 validation error detected: Value '%s' at '%s.key' failed to satisfy constraint: Member must satisfy regular expression pattern: [\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]+", t.Key, field)
		case utf8.RuneCountInString(t.Value) > maxTagValueLen:
			return nil, validationError("1 validation error detected: Value '%s' at '%s.value' failed to satisfy constraint: Member must have length less than or equal to %d", t.Value, field, maxTagValueLen)
		case strings.HasPrefix(strings.ToLower(t.Key), "aws:"):
			return nil, invalidInput("Tag key %s is invalid: keys starting with aws: are reserved for AWS use.", t.Key)
		}
		if slices.ContainsFunc(out, func(o Tag) bool { return strings.EqualFold(o.Key, t.Key) }) {
			return nil, invalidInput("Duplicate tag keys found. Please note that Tag keys are case insensitive.")
		}
		out = append(out, t)
	}
	if len(out) > maxTags {
		// A request with more than 50 tags breaks the API's length constraint; a TagRole or
		// TagPolicy that would leave more than 50 on the resource is LimitExceeded (mergeTags).
		return nil, validationError("1 validation error detected: Value at 'tags' failed to satisfy constraint: Member must have length less than or equal to %d", maxTags)
	}
	return out, nil
}

// tagKeys parses TagKeys.member.N.
func (p params) tagKeys() []string {
	var out []string
	for i := 1; ; i++ {
		name := "TagKeys.member." + strconv.Itoa(i)
		if !p.has(name) {
			return out
		}
		out = append(out, p.get(name))
	}
}

// mergeTags adds or overwrites tags (keys compare case-insensitively).
func mergeTags(existing, add []Tag) ([]Tag, *apiError) {
	out := slices.Clone(existing)
	for _, t := range add {
		i := slices.IndexFunc(out, func(o Tag) bool { return strings.EqualFold(o.Key, t.Key) })
		if i >= 0 {
			out[i] = t
		} else {
			out = append(out, t)
		}
	}
	if len(out) > maxTags {
		return nil, limitExceeded("The number of tags has reached the maximum limit.")
	}
	return out, nil
}

func removeTags(existing []Tag, keys []string) []Tag {
	return slices.DeleteFunc(slices.Clone(existing), func(t Tag) bool {
		return slices.ContainsFunc(keys, func(k string) bool { return strings.EqualFold(k, t.Key) })
	})
}

// validateDocument checks a policy document the way IAM's parser rejects the obvious:
// it must be a JSON object with Version and Statement, and within the size quota
// (counted without whitespace).
func validateDocument(doc string, kind docKind, quotaName string, quota int) *apiError {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(doc), &obj); err != nil || obj == nil {
		return malformed("Syntax errors in policy.")
	}
	if _, ok := obj["Version"]; !ok {
		return malformed("Policy document should have a Version element.")
	}
	stmt, ok := obj["Statement"]
	if !ok {
		return malformed("Missing required field Statement")
	}
	if s := bytes.TrimSpace(stmt); len(s) == 0 || (s[0] != '{' && s[0] != '[') {
		return malformed("Statement must be an object or a list of objects.")
	}
	size := 0
	for _, r := range doc {
		if !unicode.IsSpace(r) {
			size++
		}
	}
	if size > quota {
		return limitExceeded("Cannot exceed quota for %s: %d", quotaName, quota)
	}
	return validateStatements(stmt, kind)
}

// page is one page of a list answer.
type page struct {
	IsTruncated bool   `xml:"IsTruncated"`
	Marker      string `xml:"Marker,omitempty"`
}

// paginate returns the page of items (already sorted by key) selected by Marker and MaxItems.
// The marker is the opaque (base64) key of the first item of the next page, so a page
// boundary survives concurrent creations and deletions.
func paginate[T any](p params, items []T, key func(T) string) ([]T, page, *apiError) {
	maxItems := 100
	if p.has("MaxItems") {
		n, err := strconv.Atoi(p.get("MaxItems"))
		if err != nil || n < 1 || n > 1000 {
			return nil, page{}, validationError("1 validation error detected: Value '%s' at 'maxItems' failed to satisfy constraint: Member must have value between 1 and 1000", p.get("MaxItems"))
		}
		maxItems = n
	}
	start := 0
	if m := p.get("Marker"); m != "" {
		raw, err := base64.RawURLEncoding.DecodeString(m)
		if err != nil {
			return nil, page{}, invalidInput("Invalid Marker.")
		}
		from := string(raw)
		start = len(items)
		for i, it := range items {
			if key(it) >= from {
				start = i
				break
			}
		}
	}
	end := min(start+maxItems, len(items))
	out := items[start:end]
	if end < len(items) {
		return out, page{IsTruncated: true, Marker: base64.RawURLEncoding.EncodeToString([]byte(key(items[end])))}, nil
	}
	return out, page{}, nil
}
