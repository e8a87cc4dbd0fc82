package irsa

import (
	"fmt"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

// Policy language versions IAM accepts.
const (
	version2012 = "2012-10-17"
	version2008 = "2008-10-17"
)

// document and statement render the API's PolicyDocument as IAM JSON: AWS's field names and order,
// empty fields left out, Statement always a list.
type document struct {
	Version   string      `json:"Version"`
	ID        string      `json:"Id,omitempty"`
	Statement []statement `json:"Statement"`
}

type statement struct {
	Sid         string                         `json:"Sid,omitempty"`
	Effect      string                         `json:"Effect"`
	Action      []string                       `json:"Action,omitempty"`
	NotAction   []string                       `json:"NotAction,omitempty"`
	Resource    []string                       `json:"Resource,omitempty"`
	NotResource []string                       `json:"NotResource,omitempty"`
	Condition   map[string]map[string][]string `json:"Condition,omitempty"`
}

// PolicyDocumentJSON renders an IAMPolicy's document as the JSON IAM takes. The output is
// deterministic (fixed field order, sorted condition maps), so the same spec always gives the same
// bytes; whether IAM already holds it is decided by Equivalent, not by comparing bytes.
//
// The CRD rejects bad documents, but documents can also come from the legacy iam-config ConfigMap,
// which nothing validates: a document IAM would refuse as malformed (no statement, a statement
// without exactly one of Action/NotAction and of Resource/NotResource, an unknown Version or Effect)
// is an error here, which the controller reports as a permanent failure instead of retrying an AWS
// call that cannot succeed.
func PolicyDocumentJSON(doc iamv1alpha1.PolicyDocument) (string, error) {
	if doc.Version != version2012 && doc.Version != version2008 {
		return "", fmt.Errorf("policy document: Version must be %q or %q, not %q", version2012, version2008, doc.Version)
	}
	if len(doc.Statement) == 0 {
		return "", fmt.Errorf("policy document: no Statement")
	}
	out := document{Version: doc.Version, ID: doc.Id, Statement: make([]statement, 0, len(doc.Statement))}
	for i, s := range doc.Statement {
		if s.Effect != "Allow" && s.Effect != "Deny" {
			return "", fmt.Errorf("policy document: statement %d: Effect must be Allow or Deny, not %q", i, s.Effect)
		}
		if (len(s.Action) == 0) == (len(s.NotAction) == 0) {
			return "", fmt.Errorf("policy document: statement %d needs exactly one of Action and NotAction", i)
		}
		if (len(s.Resource) == 0) == (len(s.NotResource) == 0) {
			return "", fmt.Errorf("policy document: statement %d needs exactly one of Resource and NotResource", i)
		}
		st := statement{
			Sid:         s.Sid,
			Effect:      s.Effect,
			Action:      s.Action,
			NotAction:   s.NotAction,
			Resource:    s.Resource,
			NotResource: s.NotResource,
		}
		if len(s.Condition) > 0 {
			st.Condition = make(map[string]map[string][]string, len(s.Condition))
			for op, kv := range s.Condition {
				m := make(map[string][]string, len(kv))
				for k, v := range kv {
					// A nil list would render as null; an empty list is at least JSON of the type IAM
					// expects, and IAM's error about it names the key.
					m[k] = append([]string{}, v...)
				}
				st.Condition[op] = m
			}
		}
		out.Statement = append(out.Statement, st)
	}
	return marshal(out)
}
