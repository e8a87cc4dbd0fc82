package iam

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

// legacyDocument converts a policy document as the legacy iam-config ConfigMap holds it (IAM JSON,
// where Action, Resource, a Statement and condition values may be a bare string or a boolean)
// into the API's typed document, where they are always lists.
func legacyDocument(raw any) (iamv1alpha1.PolicyDocument, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return iamv1alpha1.PolicyDocument{}, fmt.Errorf("a policy document must be an object, not %T", raw)
	}
	stmts := m["Statement"]
	if one, ok := stmts.(map[string]any); ok {
		stmts = []any{one}
	}
	if list, ok := stmts.([]any); ok {
		for _, s := range list {
			stmt, ok := s.(map[string]any)
			if !ok {
				return iamv1alpha1.PolicyDocument{}, fmt.Errorf("a Statement must be an object, not %T", s)
			}
			for _, k := range []string{"Action", "NotAction", "Resource", "NotResource"} {
				if v, ok := stmt[k]; ok {
					stmt[k] = stringList(v)
				}
			}
			if cond, ok := stmt["Condition"].(map[string]any); ok {
				for _, keys := range cond {
					if km, ok := keys.(map[string]any); ok {
						for k, v := range km {
							km[k] = stringList(v)
						}
					}
				}
			}
		}
		m["Statement"] = list
	}
	b, err := json.Marshal(m)
	if err != nil {
		return iamv1alpha1.PolicyDocument{}, err
	}
	var doc iamv1alpha1.PolicyDocument
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return iamv1alpha1.PolicyDocument{}, fmt.Errorf("unsupported policy document: %w", err)
	}
	return doc, nil
}

// stringList makes a list of strings of a string, a boolean, a number or a list of them; anything
// else is left for the typed decoding to reject.
func stringList(v any) any {
	switch t := v.(type) {
	case string:
		return []string{t}
	case bool:
		return []string{strconv.FormatBool(t)}
	case float64:
		return []string{strconv.FormatFloat(t, 'f', -1, 64)}
	case []any:
		out := make([]any, 0, len(t))
		for _, e := range t {
			if l, ok := stringList(e).([]string); ok {
				out = append(out, l[0])
			} else {
				out = append(out, e)
			}
		}
		return slices.Clip(out)
	}
	return v
}
