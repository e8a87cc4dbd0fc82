package iam

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
)

func TestLegacyDocument(t *testing.T) {
	t.Parallel()
	allow := func(s iamv1alpha1.Statement) iamv1alpha1.PolicyDocument {
		return iamv1alpha1.PolicyDocument{Version: "2012-10-17", Statement: []iamv1alpha1.Statement{s}}
	}
	for _, tc := range []struct {
		name    string
		json    string // the document as the old scripts wrote it
		want    iamv1alpha1.PolicyDocument
		wantErr string
	}{{
		name: "bare strings and a single Statement object become lists",
		json: `{"Version": "2012-10-17", "Statement": {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}}`,
		want: allow(iamv1alpha1.Statement{Effect: "Allow", Action: iamv1alpha1.Actions{"s3:GetObject"}, Resource: iamv1alpha1.Resources{"arn:aws:s3:::b/*"}}),
	}, {
		name: "NotAction and NotResource too",
		json: `{"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "NotAction": "iam:*", "NotResource": "*"}]}`,
		want: allow(iamv1alpha1.Statement{Effect: "Deny", NotAction: iamv1alpha1.Actions{"iam:*"}, NotResource: iamv1alpha1.Resources{"*"}}),
	}, {
		name: "lists stay lists, Sid and Id are kept",
		json: `{"Version": "2012-10-17", "Id": "doc1", "Statement": [
			{"Sid": "One", "Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": ["arn:aws:s3:::b", "arn:aws:s3:::b/*"]},
			{"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*"}]}`,
		want: iamv1alpha1.PolicyDocument{Version: "2012-10-17", Id: "doc1", Statement: []iamv1alpha1.Statement{
			{Sid: "One", Effect: "Allow", Action: iamv1alpha1.Actions{"s3:GetObject", "s3:ListBucket"}, Resource: iamv1alpha1.Resources{"arn:aws:s3:::b", "arn:aws:s3:::b/*"}},
			{Effect: "Allow", Action: iamv1alpha1.Actions{"sqs:SendMessage"}, Resource: iamv1alpha1.Resources{"*"}},
		}},
	}, {
		name: "boolean, number and string condition values become lists of strings",
		json: `{"Version": "2012-10-17", "Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Condition": {
			"Bool": {"aws:SecureTransport": true, "aws:MultiFactorAuthPresent": false},
			"NumericLessThan": {"s3:max-keys": 10, "s3:x-amz-content-length": 1.5},
			"StringEquals": {"aws:RequestedRegion": "eu-west-1"},
			"StringLike": {"s3:prefix": ["home/", 7, true]}}}}`,
		want: allow(iamv1alpha1.Statement{Effect: "Allow", Action: iamv1alpha1.Actions{"s3:*"}, Resource: iamv1alpha1.Resources{"*"},
			Condition: map[string]iamv1alpha1.ConditionValues{
				"Bool":            {"aws:SecureTransport": {"true"}, "aws:MultiFactorAuthPresent": {"false"}},
				"NumericLessThan": {"s3:max-keys": {"10"}, "s3:x-amz-content-length": {"1.5"}},
				"StringEquals":    {"aws:RequestedRegion": {"eu-west-1"}},
				"StringLike":      {"s3:prefix": {"home/", "7", "true"}},
			}}),
	}, {
		name: "a large account number is not written in exponent form",
		json: `{"Version": "2012-10-17", "Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Condition": {"StringEquals": {"aws:PrincipalAccount": 123456789012}}}}`,
		want: allow(iamv1alpha1.Statement{Effect: "Allow", Action: iamv1alpha1.Actions{"s3:*"}, Resource: iamv1alpha1.Resources{"*"},
			Condition: map[string]iamv1alpha1.ConditionValues{"StringEquals": {"aws:PrincipalAccount": {"123456789012"}}}}),
	}, {
		name:    "an unknown statement field (a resource policy's Principal) is rejected by name",
		json:    `{"Version": "2012-10-17", "Statement": {"Effect": "Allow", "Principal": "*", "Action": "s3:*", "Resource": "*"}}`,
		wantErr: `unsupported policy document: json: unknown field "Principal"`,
	}, {
		name:    "an unknown top-level field is rejected by name",
		json:    `{"Version": "2012-10-17", "Comment": "x", "Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}}`,
		wantErr: `unknown field "Comment"`,
	}, {
		name:    "a document that is not an object",
		json:    `"{\"Version\": \"2012-10-17\"}"`,
		wantErr: "a policy document must be an object, not string",
	}, {
		name:    "a Statement that is not an object",
		json:    `{"Version": "2012-10-17", "Statement": ["s3:*"]}`,
		wantErr: "a Statement must be an object, not string",
	}, {
		name:    "an Action that is an object",
		json:    `{"Version": "2012-10-17", "Statement": {"Effect": "Allow", "Action": {"s3": "*"}, "Resource": "*"}}`,
		wantErr: "unsupported policy document",
	}, {
		name:    "a condition operator whose value is not an object",
		json:    `{"Version": "2012-10-17", "Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Condition": {"Bool": true}}}`,
		wantErr: "unsupported policy document",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var raw any
			must(t, json.Unmarshal([]byte(tc.json), &raw))
			got, err := legacyDocument(raw)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			must(t, err)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("document\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestTranslate(t *testing.T) {
	t.Parallel()
	cm := func(policies, attachments string) *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: CompatConfigMap},
			Data:       map[string]string{KeyPolicies: policies, KeyAttachments: attachments},
		}
	}
	const policies = `
read: {"Version": "2012-10-17", "Statement": {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}}
send:
  Version: 2012-10-17
  Statement:
  - Effect: Allow
    Action: sqs:SendMessage
    Resource: "*"
    Condition:
      Bool: {aws:SecureTransport: true}
`

	t.Run("JSON and YAML documents, sorted and de-duplicated attachments", func(t *testing.T) {
		pols, sas, problems := translate(cm(policies, "web: [send, read, send]\nworker: [read]\nidle: []\n"))
		if len(problems) > 0 {
			t.Fatalf("problems %v", problems)
		}
		var names []string
		for _, p := range pols {
			names = append(names, p.Namespace+"/"+p.Name)
			if p.Spec.Description != "from ConfigMap team/iam-config" {
				t.Errorf("description %q", p.Spec.Description)
			}
		}
		if !slices.Equal(names, []string{"team/read", "team/send"}) {
			t.Fatalf("policies %v", names)
		}
		send := pols[1].Spec.Document
		// An unquoted YAML date stays the string IAM wants.
		if send.Version != "2012-10-17" || !slices.Equal(send.Statement[0].Action, []string{"sqs:SendMessage"}) ||
			!slices.Equal(send.Statement[0].Condition["Bool"]["aws:SecureTransport"], []string{"true"}) {
			t.Errorf("send = %+v", send)
		}
		got := map[string][]string{}
		for _, a := range sas {
			if a.Name != a.Spec.ServiceAccountName || a.Namespace != "team" || a.Spec.CreateServiceAccount {
				t.Errorf("IAMServiceAccount %+v", a)
			}
			got[a.Name] = a.Spec.Policies
		}
		want := map[string][]string{"idle": {}, "web": {"read", "send"}, "worker": {"read"}}
		if len(got) != len(want) {
			t.Fatalf("service accounts %v, want %v", got, want)
		}
		for k, v := range want {
			if !slices.Equal(got[k], v) {
				t.Errorf("%s: policies %v, want %v", k, got[k], v)
			}
		}
	})

	t.Run("empty keys mean no objects", func(t *testing.T) {
		pols, sas, problems := translate(cm("", ""))
		if len(pols)+len(sas)+len(problems) != 0 {
			t.Errorf("got %v %v %v", pols, sas, problems)
		}
	})

	for _, tc := range []struct {
		name, policies, attachments string
		want                        []string
	}{
		{"policies.yaml does not parse", "read: {unclosed", "", []string{"policies.yaml: "}},
		{"attachments are not a map of lists", policies, "web: read\n", []string{"serviceaccount_attachments.yaml: ", "want: ServiceAccount name: [policy names]"}},
		{"attachments do not parse", policies, "web: [read\n", []string{"serviceaccount_attachments.yaml: "}},
		{"a policy name that is not a DNS name", "Read_All: {\"Version\": \"2012-10-17\", \"Statement\": {\"Effect\": \"Allow\", \"Action\": \"s3:*\", \"Resource\": \"*\"}}", "", []string{`policy name "Read_All"`}},
		{"a ServiceAccount name that is not a DNS name", policies, "Web_App: [read]\n", []string{`ServiceAccount name "Web_App"`}},
		{"an attachment naming an undefined policy", policies, "web: [read, nope]\n", []string{`web names policy "nope", which policies.yaml does not define`}},
		{"an unsupported document", "read: {\"Version\": \"2012-10-17\", \"Statement\": {\"Effect\": \"Allow\", \"Principal\": \"*\", \"Action\": \"s3:*\", \"Resource\": \"*\"}}", "", []string{`policy "read"`, `unknown field "Principal"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, problems := translate(cm(tc.policies, tc.attachments))
			all := strings.Join(problems, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("problems %q do not contain %q", all, w)
				}
			}
		})
	}
}
