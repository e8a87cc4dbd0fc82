package irsa

import "testing"

func TestTrustsWithExternalID(t *testing.T) {
	const role = "arn:aws:iam::111122223333:role/quartermaster/c/eks-sa-ns-app"
	both := []string{"sts:AssumeRole", "sts:TagSession"}
	doc := func(principal, actions, op string) string {
		return `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"` + principal + `"},"Action":` + actions +
			`,"Condition":{"` + op + `":{"sts:ExternalId":"id-1"}}}]}`
	}
	for _, c := range []struct {
		name, doc string
		actions   []string
		want      bool
	}{
		{"the role, both actions", doc(role, `["sts:AssumeRole","sts:TagSession"]`, "StringEquals"), both, true},
		{"TagSession missing while session tags are on", doc(role, `"sts:AssumeRole"`, "StringEquals"), both, false},
		{"TagSession not needed with session tags off", doc(role, `"sts:AssumeRole"`, "StringEquals"), []string{"sts:AssumeRole"}, true},
		{"the account's root", doc("arn:aws:iam::111122223333:root", `"sts:*"`, "StringEquals"), both, true},
		{"StringLike with the ID", doc(role, `"*"`, "StringLike"), both, true},
		{"another principal", doc("arn:aws:iam::444455556666:role/x", `"*"`, "StringEquals"), both, false},
		{"another external ID", `{"Statement":{"Effect":"Allow","Principal":{"AWS":"` + role + `"},"Action":"*","Condition":{"StringEquals":{"sts:ExternalId":"id-2"}}}}`, both, false},
		{"no condition", `{"Statement":{"Effect":"Allow","Principal":{"AWS":"` + role + `"},"Action":"*"}}`, both, false},
	} {
		if got := TrustsWithExternalID(c.doc, role, "id-1", c.actions); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
