package iam

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

func unstructuredObject(kind, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(iamv1alpha1.GroupVersion.WithKind(kind))
	u.SetNamespace("t-validation")
	u.SetName(name)
	return u
}

func statement(change func(map[string]any)) map[string]any {
	s := map[string]any{"Effect": "Allow", "Action": []any{"s3:GetObject"}, "Resource": []any{"arn:aws:s3:::b/*"}}
	if change != nil {
		change(s)
	}
	return s
}

func policySpec(change func(doc map[string]any)) map[string]any {
	doc := map[string]any{"Version": "2012-10-17", "Statement": []any{statement(nil)}}
	if change != nil {
		change(doc)
	}
	return map[string]any{"document": doc}
}

func saSpec(change func(map[string]any)) map[string]any {
	s := map[string]any{"serviceAccountName": "app", "policies": []any{"read"}}
	if change != nil {
		change(s)
	}
	return s
}

func manyStrings(prefix string, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = prefix + strings.Repeat("x", i+1)
	}
	return out
}

// testValidation proves that the API server rejects each bad spec with a clear message: one case
// per rule. Creates are dry runs, so no controller sees them.
func testValidation(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-validation")
	pol := func(change func(map[string]any)) *unstructured.Unstructured {
		return unstructuredObject("IAMPolicy", "read", policySpec(change))
	}
	stmt := func(change func(map[string]any)) *unstructured.Unstructured {
		return pol(func(d map[string]any) { d["Statement"] = []any{statement(change)} })
	}
	sa := func(change func(map[string]any)) *unstructured.Unstructured {
		return unstructuredObject("IAMServiceAccount", "app", saSpec(change))
	}
	cases := []struct {
		name   string
		obj    *unstructured.Unstructured
		reject string // "" accepts
	}{
		{name: "policy valid", obj: pol(nil)},
		{name: "policy with NotAction, NotResource and a condition", obj: stmt(func(s map[string]any) {
			delete(s, "Action")
			delete(s, "Resource")
			s["NotAction"], s["NotResource"] = []any{"iam:*"}, []any{"*"}
			s["Condition"] = map[string]any{"StringEquals": map[string]any{"aws:RequestedRegion": []any{"eu-west-1"}}}
		})},
		{name: "document missing", obj: unstructuredObject("IAMPolicy", "read", map[string]any{}), reject: "spec.document: Required value"},
		{name: "Version missing", obj: pol(func(d map[string]any) { delete(d, "Version") }), reject: "spec.document.Version: Required value"},
		{name: "Version unknown", obj: pol(func(d map[string]any) { d["Version"] = "2020-01-01" }), reject: `spec.document.Version: Unsupported value: "2020-01-01"`},
		{name: "Statement missing", obj: pol(func(d map[string]any) { delete(d, "Statement") }), reject: "spec.document.Statement: Required value"},
		{name: "Statement empty", obj: pol(func(d map[string]any) { d["Statement"] = []any{} }), reject: "spec.document.Statement: Invalid value"},
		{name: "Effect missing", obj: stmt(func(s map[string]any) { delete(s, "Effect") }), reject: "Effect: Required value"},
		{name: "Effect unknown", obj: stmt(func(s map[string]any) { s["Effect"] = "Maybe" }), reject: `Effect: Unsupported value: "Maybe"`},
		{name: "no Action nor NotAction", obj: stmt(func(s map[string]any) { delete(s, "Action") }), reject: "a statement needs exactly one of Action and NotAction"},
		{name: "Action and NotAction", obj: stmt(func(s map[string]any) { s["NotAction"] = []any{"s3:*"} }), reject: "a statement needs exactly one of Action and NotAction"},
		{name: "no Resource nor NotResource", obj: stmt(func(s map[string]any) { delete(s, "Resource") }), reject: "a statement needs exactly one of Resource and NotResource"},
		{name: "Action as a bare string", obj: stmt(func(s map[string]any) { s["Action"] = "s3:GetObject" }), reject: `Statement[0].Action in body must be of type array: "string"`},
		{name: "Action malformed", obj: stmt(func(s map[string]any) { s["Action"] = []any{"s3 GetObject"} }), reject: "Action[0] in body should match"},
		{name: "Action list empty", obj: stmt(func(s map[string]any) { s["Action"] = []any{} }), reject: "Action in body should have at least 1 items"},
		{name: "Resource not an ARN", obj: stmt(func(s map[string]any) { s["Resource"] = []any{"my-bucket"} }), reject: "Resource[0] in body should match"},
		{name: "Sid with a space", obj: stmt(func(s map[string]any) { s["Sid"] = "read all" }), reject: "Sid in body should match"},
		{name: "Resource with too few ARN parts", obj: stmt(func(s map[string]any) { s["Resource"] = []any{"arn:aws:s3"} }), reject: "Resource[0] in body should match"},
		{name: "condition operator unknown", obj: stmt(func(s map[string]any) {
			s["Condition"] = map[string]any{"StringEqualz": map[string]any{"aws:SourceIp": []any{"10.0.0.0/8"}}}
		}), reject: "a Condition operator must be one of IAM's"},
		{name: "condition operators with prefixes and IfExists", obj: stmt(func(s map[string]any) {
			s["Condition"] = map[string]any{"ForAnyValue:StringLikeIfExists": map[string]any{"aws:TagKeys": []any{"a*"}}, "Null": map[string]any{"aws:TokenIssueTime": []any{"true"}}}
		})},
		{name: "condition without keys", obj: stmt(func(s map[string]any) { s["Condition"] = map[string]any{"Bool": map[string]any{}} }), reject: "should have at least 1 properties"},
		{name: "description too long", obj: unstructuredObject("IAMPolicy", "read", func() map[string]any {
			s := policySpec(nil)
			s["description"] = strings.Repeat("d", 1001)
			return s
		}()), reject: "spec.description: Too long"},

		{name: "serviceaccount valid", obj: sa(func(s map[string]any) {
			s["managedPolicyArns"] = []any{"arn:aws:iam::aws:policy/ReadOnlyAccess"}
			s["maxSessionDuration"] = int64(7200)
			s["permissionsBoundaryArn"] = "arn:aws:iam::123456789012:policy/boundary"
		})},
		{name: "serviceAccountName missing", obj: sa(func(s map[string]any) { delete(s, "serviceAccountName") }), reject: "spec.serviceAccountName: Required value"},
		{name: "serviceAccountName not a DNS name", obj: sa(func(s map[string]any) { s["serviceAccountName"] = "App_1" }), reject: "spec.serviceAccountName in body should match"},
		{name: "policy name not a DNS name", obj: sa(func(s map[string]any) { s["policies"] = []any{"Read"} }), reject: "spec.policies[0] in body should match"},
		{name: "policies repeated", obj: sa(func(s map[string]any) { s["policies"] = []any{"read", "read"} }), reject: `spec.policies[1]: Duplicate value: "read"`},
		{name: "managed ARN not a policy ARN", obj: sa(func(s map[string]any) { s["managedPolicyArns"] = []any{"arn:aws:iam::aws:role/x"} }), reject: "spec.managedPolicyArns[0] in body should match"},
		{name: "more than 20 policies", obj: sa(func(s map[string]any) {
			s["policies"] = manyStrings("p", 12)
			s["managedPolicyArns"] = manyStrings("arn:aws:iam::aws:policy/", 9)
		}), reject: "a role can have at most 20 managed policies (policies and managedPolicyArns together)"},
		{name: "maxSessionDuration too short", obj: sa(func(s map[string]any) { s["maxSessionDuration"] = int64(900) }), reject: "spec.maxSessionDuration in body should be greater than or equal to 3600"},
		{name: "maxSessionDuration too long", obj: sa(func(s map[string]any) { s["maxSessionDuration"] = int64(43201) }), reject: "spec.maxSessionDuration in body should be less than or equal to 43200"},
		{name: "mechanism PodIdentity", obj: sa(func(s map[string]any) { s["mechanism"] = "PodIdentity" })},
		{name: "mechanism Both", obj: sa(func(s map[string]any) { s["mechanism"] = "Both" })},
		{name: "mechanism unknown", obj: sa(func(s map[string]any) { s["mechanism"] = "Kiam" }), reject: `spec.mechanism: Unsupported value: "Kiam": supported values: "IRSA", "PodIdentity", "Both"`},
		{name: "shared role owner with permissions", obj: sa(func(s map[string]any) {
			s["sharedRole"] = map[string]any{"name": "payments", "owner": true}
			s["maxSessionDuration"] = int64(7200)
		})},
		{name: "shared role member", obj: sa(func(s map[string]any) {
			delete(s, "policies")
			s["sharedRole"] = map[string]any{"name": "payments"}
			s["mechanism"] = "PodIdentity"
		})},
		{name: "shared role member with permissions", obj: sa(func(s map[string]any) { s["sharedRole"] = map[string]any{"name": "payments"} }),
			reject: "a sharedRole member takes the role's permissions from its owner"},
		{name: "shared role named like a ServiceAccount's role", obj: sa(func(s map[string]any) { s["sharedRole"] = map[string]any{"name": "eks-sa-team-app", "owner": true} }),
			reject: "role names starting eks-sa- are the per-ServiceAccount roles'"},
		{name: "shared role name not an IAM name", obj: sa(func(s map[string]any) { s["sharedRole"] = map[string]any{"name": "pay ments", "owner": true} }),
			reject: "spec.sharedRole.name in body should match"},
		{name: "shared role name too long", obj: sa(func(s map[string]any) {
			s["sharedRole"] = map[string]any{"name": strings.Repeat("r", 65), "owner": true}
		}),
			reject: "spec.sharedRole.name: Too long"},
		{name: "shared role with a target role", obj: sa(func(s map[string]any) {
			s["sharedRole"] = map[string]any{"name": "payments", "owner": true}
			s["mechanism"], s["targetRoleArn"] = "PodIdentity", "arn:aws:iam::111122223333:role/target"
		}), reject: "targetRoleArn cannot be used with sharedRole"},
		{name: "shared role without session tags", obj: sa(func(s map[string]any) {
			s["sharedRole"] = map[string]any{"name": "payments", "owner": true}
			s["mechanism"], s["disableSessionTags"] = "PodIdentity", true
		}), reject: "disableSessionTags cannot be used with sharedRole"},
		{name: "shared role owner listing members", obj: sa(func(s map[string]any) {
			s["sharedRole"] = map[string]any{"name": "payments", "owner": true, "members": []any{"prod-us/payments/app", "eu_2:x+y@z=w/team-a/app.v2"}}
		})},
		{name: "shared role member listing members", obj: sa(func(s map[string]any) {
			delete(s, "policies")
			s["sharedRole"] = map[string]any{"name": "payments", "members": []any{"prod-us/payments/app"}}
		}), reject: "only the owner (sharedRole.owner: true) lists the members of a shared role"},
		{name: "shared role member not cluster/namespace/name", obj: sa(func(s map[string]any) {
			s["sharedRole"] = map[string]any{"name": "payments", "owner": true, "members": []any{"payments/app"}}
		}), reject: "spec.sharedRole.members[0] in body should match"},
		{name: "shared role member as a glob", obj: sa(func(s map[string]any) {
			s["sharedRole"] = map[string]any{"name": "payments", "owner": true, "members": []any{"prod/*/app"}}
		}), reject: "spec.sharedRole.members[0] in body should match"},
		{name: "shared role listing a member twice", obj: sa(func(s map[string]any) {
			s["sharedRole"] = map[string]any{"name": "payments", "owner": true, "members": []any{"prod/a/app", "prod/a/app"}}
		}), reject: `spec.sharedRole.members[1]: Duplicate value: "prod/a/app"`},
		{name: "boundary not a policy ARN", obj: sa(func(s map[string]any) { s["permissionsBoundaryArn"] = "boundary" }), reject: "spec.permissionsBoundaryArn in body should match"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := f.c.Create(ctx, c.obj, client.DryRunAll)
			if c.reject == "" {
				must(t, err)
				return
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.reject) {
				t.Fatalf("got %v; want Invalid with %q", err, c.reject)
			}
		})
	}

	t.Run("createServiceAccount defaults to false, mechanism to IRSA", func(t *testing.T) {
		obj := sa(nil)
		must(t, f.c.Create(ctx, obj, client.DryRunAll))
		if v, found, _ := unstructured.NestedBool(obj.Object, "spec", "createServiceAccount"); !found || v {
			t.Errorf("createServiceAccount = %v (found %v), want false", v, found)
		}
		if v, _, _ := unstructured.NestedString(obj.Object, "spec", "mechanism"); v != "IRSA" {
			t.Errorf("mechanism = %q, want IRSA", v)
		}
	})

	// Immutable fields: a real object (deleted before any controller runs).
	t.Run("serviceAccountName and createServiceAccount immutable", func(t *testing.T) {
		obj := sa(nil)
		must(t, f.c.Create(ctx, obj))
		defer func() { must(t, f.c.Delete(ctx, obj)) }()
		for field, value := range map[string]any{"serviceAccountName": "other", "createServiceAccount": true} {
			upd := obj.DeepCopy()
			must(t, unstructured.SetNestedField(upd.Object, value, "spec", field))
			err := f.c.Update(ctx, upd, client.DryRunAll)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), field+" is immutable") {
				t.Errorf("%s: got %v; want the immutability message", field, err)
			}
		}
		upd := obj.DeepCopy()
		must(t, unstructured.SetNestedStringSlice(upd.Object, []string{"read", "write"}, "spec", "policies"))
		must(t, f.c.Update(ctx, upd, client.DryRunAll))
		upd = obj.DeepCopy()
		must(t, unstructured.SetNestedMap(upd.Object, map[string]any{"name": "payments", "owner": true}, "spec", "sharedRole"))
		if err := f.c.Update(ctx, upd, client.DryRunAll); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "sharedRole cannot be added or removed") {
			t.Errorf("adding sharedRole: got %v; want the immutability message", err)
		}
	})

	t.Run("a shared role's name is immutable, its owner field is not", func(t *testing.T) {
		obj := sa(func(s map[string]any) { s["sharedRole"] = map[string]any{"name": "payments", "owner": true} })
		obj.SetName("shared")
		must(t, f.c.Create(ctx, obj))
		defer func() { must(t, f.c.Delete(ctx, obj)) }()
		upd := obj.DeepCopy()
		must(t, unstructured.SetNestedField(upd.Object, "orders", "spec", "sharedRole", "name"))
		if err := f.c.Update(ctx, upd, client.DryRunAll); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "sharedRole.name is immutable") {
			t.Errorf("renaming: got %v; want the immutability message", err)
		}
		upd = obj.DeepCopy()
		unstructured.RemoveNestedField(upd.Object, "spec", "sharedRole")
		if err := f.c.Update(ctx, upd, client.DryRunAll); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "sharedRole cannot be added or removed") {
			t.Errorf("removing: got %v; want the immutability message", err)
		}
		upd = obj.DeepCopy()
		must(t, unstructured.SetNestedField(upd.Object, false, "spec", "sharedRole", "owner"))
		unstructured.RemoveNestedField(upd.Object, "spec", "policies")
		must(t, f.c.Update(ctx, upd, client.DryRunAll))
	})
}
