package intent

import (
	"fmt"
	"maps"
	"strings"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
)

// celEnv declares what a binding's spec.cel expressions may read: the workload's labels, as in
// Nimbus.
var celEnv = func() *cel.Env {
	env, err := cel.NewEnv(cel.Variable("labels", cel.MapType(cel.StringType, cel.StringType)))
	if err != nil {
		panic(err)
	}
	return env
}()

// CELForms says which expressions CELSelector takes, for messages.
const CELForms = `labels["app"] == "nginx", labels.app == "nginx", labels["app"] in ["nginx"], joined by &&`

// CELSelector turns a binding's spec.cel expressions into the labels they require, merged with
// matchLabels. The selectors of every engine (KubeArmor, NetworkPolicy, Kyverno) are label maps,
// so only expressions that require labels to have one value each can become one; anything else
// is refused naming the expression, rather than guessed at.
//
// Nimbus also reads these forms, but resolves them against the pods running now: a label no pod
// has yet is left out (and with nothing left, no NimbusPolicy is made until a pod has it). The
// labels an expression requires are a selector whether or not a pod has them yet, so they are
// taken as written.
func CELSelector(exprs []string, matchLabels map[string]string) (map[string]string, error) {
	if len(exprs) == 0 {
		return matchLabels, nil
	}
	out := maps.Clone(matchLabels)
	if out == nil {
		out = map[string]string{}
	}
	from := map[string]string{} // label → what required it, for conflicts
	for k := range matchLabels {
		from[k] = "selector.workloadSelector.matchLabels"
	}
	for i, src := range exprs {
		ast, iss := celEnv.Compile(src)
		if iss != nil && iss.Err() != nil {
			// The first line names the error and its column (the rest draws it).
			msg, _, _ := strings.Cut(iss.Err().Error(), "\n")
			return nil, fmt.Errorf("cel[%d] %q: %s", i, src, msg)
		}
		if ast.OutputType() != cel.BoolType {
			return nil, fmt.Errorf("cel[%d] %q: is a %s, not a condition on labels", i, src, ast.OutputType())
		}
		required, err := requiredLabels(ast.NativeRep().Expr())
		if err != nil {
			return nil, fmt.Errorf("cel[%d] %q: %w; the forms a selector can take: %s", i, src, err, CELForms)
		}
		for _, kv := range required {
			if v, ok := out[kv[0]]; ok && v != kv[1] {
				return nil, fmt.Errorf("cel[%d] %q requires label %s=%s, but %s requires %s=%s: no workload can match both",
					i, src, kv[0], kv[1], from[kv[0]], kv[0], v)
			}
			out[kv[0]] = kv[1]
			from[kv[0]] = fmt.Sprintf("cel[%d]", i)
		}
	}
	return out, nil
}

// requiredLabels reads an expression made of label equalities joined by &&, in source order.
func requiredLabels(e celast.Expr) ([][2]string, error) {
	if e.Kind() != celast.CallKind {
		return nil, fmt.Errorf("not a comparison of a label with a value")
	}
	call := e.AsCall()
	args := call.Args()
	switch call.FunctionName() {
	case operators.LogicalAnd:
		var out [][2]string
		for _, a := range args {
			kv, err := requiredLabels(a)
			if err != nil {
				return nil, err
			}
			out = append(out, kv...)
		}
		return out, nil
	case operators.Equals:
		key, ok := labelKey(args[0])
		value, isString := stringLiteral(args[1])
		if !ok {
			key, ok = labelKey(args[1])
			value, isString = stringLiteral(args[0])
		}
		if !ok || !isString {
			return nil, fmt.Errorf("== must compare labels[\"key\"] with a string")
		}
		return [][2]string{{key, value}}, nil
	case operators.In:
		key, ok := labelKey(args[0])
		if !ok || args[1].Kind() != celast.ListKind || len(args[1].AsList().Elements()) != 1 {
			return nil, fmt.Errorf("in must test labels[\"key\"] against a list of one string (a label selector holds one value per key)")
		}
		value, isString := stringLiteral(args[1].AsList().Elements()[0])
		if !isString {
			return nil, fmt.Errorf("in must test labels[\"key\"] against a list of one string")
		}
		return [][2]string{{key, value}}, nil
	}
	name := call.FunctionName()
	if op, ok := operators.FindReverse(name); ok {
		name = op
	}
	return nil, fmt.Errorf("%s cannot be written as required labels", strings.Trim(name, "_@"))
}

// labelKey reads labels["key"] or labels.key.
func labelKey(e celast.Expr) (string, bool) {
	switch e.Kind() {
	case celast.CallKind:
		c := e.AsCall()
		if c.FunctionName() != operators.Index || !isLabels(c.Args()[0]) {
			return "", false
		}
		return stringLiteral(c.Args()[1])
	case celast.SelectKind:
		s := e.AsSelect()
		return s.FieldName(), !s.IsTestOnly() && isLabels(s.Operand())
	}
	return "", false
}

func isLabels(e celast.Expr) bool { return e.Kind() == celast.IdentKind && e.AsIdent() == "labels" }

func stringLiteral(e celast.Expr) (string, bool) {
	if e.Kind() != celast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(types.String)
	return string(s), ok
}
