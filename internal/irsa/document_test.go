package irsa

import (
	"strings"
	"testing"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

func TestPolicyDocumentJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  iamv1alpha1.PolicyDocument
		want string // golden; "" for an error
		err  string
	}{{
		name: "minimal",
		doc: iamv1alpha1.PolicyDocument{Version: "2012-10-17", Statement: []iamv1alpha1.Statement{{
			Effect: "Allow", Action: iamv1alpha1.Actions{"s3:GetObject"}, Resource: iamv1alpha1.Resources{"arn:aws:s3:::bucket/*"},
		}}},
		want: `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::bucket/*"]}]}`,
	}, {
		name: "every field, condition maps sorted, & not escaped",
		doc: iamv1alpha1.PolicyDocument{Version: "2008-10-17", Id: "doc1", Statement: []iamv1alpha1.Statement{{
			Sid: "Read", Effect: "Allow",
			Action:   iamv1alpha1.Actions{"s3:List*", "s3:GetObject"},
			Resource: iamv1alpha1.Resources{"arn:aws:s3:::a&b/*", "*"},
			Condition: map[string]iamv1alpha1.ConditionValues{
				"StringLike":   {"s3:prefix": {"home/", "public/"}},
				"StringEquals": {"aws:RequestedRegion": {"eu-west-1"}, "aws:PrincipalTag/team": {"a"}},
			},
		}, {
			Effect: "Deny", NotAction: iamv1alpha1.Actions{"iam:*"}, NotResource: iamv1alpha1.Resources{"arn:aws:iam::*:role/x"},
		}}},
		want: `{"Version":"2008-10-17","Id":"doc1","Statement":[` +
			`{"Sid":"Read","Effect":"Allow","Action":["s3:List*","s3:GetObject"],"Resource":["arn:aws:s3:::a&b/*","*"],` +
			`"Condition":{"StringEquals":{"aws:PrincipalTag/team":["a"],"aws:RequestedRegion":["eu-west-1"]},"StringLike":{"s3:prefix":["home/","public/"]}}},` +
			`{"Effect":"Deny","NotAction":["iam:*"],"NotResource":["arn:aws:iam::*:role/x"]}]}`,
	}, {
		name: "nil condition values render as an empty list, not null",
		doc: iamv1alpha1.PolicyDocument{Version: "2012-10-17", Statement: []iamv1alpha1.Statement{{
			Effect: "Allow", Action: iamv1alpha1.Actions{"*"}, Resource: iamv1alpha1.Resources{"*"},
			Condition: map[string]iamv1alpha1.ConditionValues{"Bool": {"aws:SecureTransport": nil}},
		}}},
		want: `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["*"],"Resource":["*"],"Condition":{"Bool":{"aws:SecureTransport":[]}}}]}`,
	}, {
		name: "no version", err: "Version",
		doc: iamv1alpha1.PolicyDocument{Statement: []iamv1alpha1.Statement{{Effect: "Allow", Action: iamv1alpha1.Actions{"*"}, Resource: iamv1alpha1.Resources{"*"}}}},
	}, {
		name: "no statement", err: "no Statement",
		doc: iamv1alpha1.PolicyDocument{Version: "2012-10-17"},
	}, {
		name: "bad effect", err: "Effect",
		doc: iamv1alpha1.PolicyDocument{Version: "2012-10-17", Statement: []iamv1alpha1.Statement{{
			Effect: "allow", Action: iamv1alpha1.Actions{"*"}, Resource: iamv1alpha1.Resources{"*"}}}},
	}, {
		name: "both Action and NotAction", err: "Action and NotAction",
		doc: iamv1alpha1.PolicyDocument{Version: "2012-10-17", Statement: []iamv1alpha1.Statement{{
			Effect: "Allow", Action: iamv1alpha1.Actions{"*"}, NotAction: iamv1alpha1.Actions{"iam:*"}, Resource: iamv1alpha1.Resources{"*"}}}},
	}, {
		name: "no Resource", err: "Resource and NotResource",
		doc: iamv1alpha1.PolicyDocument{Version: "2012-10-17", Statement: []iamv1alpha1.Statement{{
			Effect: "Allow", Action: iamv1alpha1.Actions{"*"}}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PolicyDocumentJSON(tc.doc)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("PolicyDocumentJSON = %s, %v; want an error about %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("PolicyDocumentJSON =\n%s, %v\nwant\n%s", got, err, tc.want)
			}
			if again, _ := PolicyDocumentJSON(tc.doc); again != got {
				t.Fatalf("PolicyDocumentJSON is not deterministic:\n%s\n%s", got, again)
			}
			if eq, err := Equivalent(got, got); err != nil || !eq {
				t.Fatalf("Equivalent(rendered, rendered) = %v, %v", eq, err)
			}
		})
	}
}
