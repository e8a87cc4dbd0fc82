package irsa

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
)

// iamEncoded is a document as IAM returns it: compact JSON, percent-encoded (RFC 3986).
func iamEncoded(doc string) string {
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(doc)); err != nil {
		panic(err)
	}
	return percentEncode(b.String())
}

// percentEncode encodes as RFC 3986 does: a space is %20, never "+".
func percentEncode(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "+", "%20") }

func TestEquivalent(t *testing.T) {
	const rendered = `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::bucket/*"]}]}`
	const trust = `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Federated":"arn:aws:iam::1:oidc-provider/x"},` +
		`"Action":"sts:AssumeRoleWithWebIdentity","Condition":{"StringEquals":{"x:sub":"system:serviceaccount:a:b","x:aud":"sts.amazonaws.com"}}}]}`
	for _, tc := range []struct {
		name string
		a, b string
		want bool
	}{
		{"identical", rendered, rendered, true},
		{"URL-encoded as IAM returns it", rendered, iamEncoded(rendered), true},
		{"both URL-encoded", iamEncoded(rendered), iamEncoded(rendered), true},
		{"URL-encoded with spaces (%20)", rendered, percentEncode(`{ "Version": "2012-10-17", "Statement": [ { "Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::bucket/*" } ] }`), true},
		{"indented, keys reordered", rendered, "\n {\n  \"Statement\": [{\"Resource\": [\"arn:aws:s3:::bucket/*\"], \"Action\": [\"s3:GetObject\"], \"Effect\": \"Allow\"}],\n  \"Version\": \"2012-10-17\"\n}\n", true},
		{"single string vs one-element list", rendered, `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:::bucket/*"}]}`, true},
		{"Statement object vs list of one", rendered, `{"Version":"2012-10-17","Statement":{"Effect":"Allow","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::bucket/*"]}}`, true},
		{"action case", rendered, `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["S3:getobject"],"Resource":["arn:aws:s3:::bucket/*"]}]}`, true},
		{"resource case", rendered, `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::Bucket/*"]}]}`, false},
		{"action set: order and duplicates",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetObject","s3:PutObject"],"Resource":"*"}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:PutObject","s3:getobject","s3:GetObject"],"Resource":"*"}]}`, true},
		{"resource set order",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":["arn:aws:s3:::a","arn:aws:s3:::b"]}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":["arn:aws:s3:::b","arn:aws:s3:::a","arn:aws:s3:::b"]}]}`, true},
		{"extra action", rendered, `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetObject","s3:PutObject"],"Resource":["arn:aws:s3:::bucket/*"]}]}`, false},
		{"Action vs NotAction", rendered, `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","NotAction":["s3:GetObject"],"Resource":["arn:aws:s3:::bucket/*"]}]}`, false},
		{"effect", rendered, strings.Replace(rendered, "Allow", "Deny", 1), false},
		{"version differs", rendered, strings.Replace(rendered, "2012-10-17", "2008-10-17", 1), false},
		{"version missing vs 2012", rendered, `{"Statement":[{"Effect":"Allow","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::bucket/*"]}]}`, false},
		{"version missing vs 2008", strings.Replace(rendered, "2012-10-17", "2008-10-17", 1), `{"Statement":[{"Effect":"Allow","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::bucket/*"]}]}`, true},
		{"statement order",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"a:b","Resource":"*"},{"Effect":"Deny","Action":"c:d","Resource":"*"}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Deny","Action":"c:d","Resource":"*"},{"Effect":"Allow","Action":"a:b","Resource":"*"}]}`, true},
		{"statements are a multiset",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"a:b","Resource":"*"},{"Effect":"Allow","Action":"a:b","Resource":"*"}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"a:b","Resource":"*"}]}`, false},
		{"Sid differs",
			`{"Version":"2012-10-17","Statement":[{"Sid":"A","Effect":"Allow","Action":"a:b","Resource":"*"}]}`,
			`{"Version":"2012-10-17","Statement":[{"Sid":"B","Effect":"Allow","Action":"a:b","Resource":"*"}]}`, false},
		{"Id differs", `{"Version":"2012-10-17","Id":"x","Statement":[]}`, `{"Version":"2012-10-17","Id":"y","Statement":[]}`, false},
		{"trust policy vs reordered and listed", trust,
			`{"Statement":[{"Condition":{"StringEquals":{"x:aud":["sts.amazonaws.com"],"X:SUB":["system:serviceaccount:a:b"]}},` +
				`"Action":["sts:assumerolewithwebidentity"],"Principal":{"Federated":["arn:aws:iam::1:oidc-provider/x"]},"Effect":"Allow"}],"Version":"2012-10-17"}`, true},
		{"trust policy for another ServiceAccount", trust, strings.Replace(trust, "a:b", "a:c", 1), false},
		{"condition operator case", trust, strings.Replace(trust, "StringEquals", "stringequals", 1), false},
		{"condition value case", trust, strings.Replace(trust, "sts.amazonaws.com", "STS.amazonaws.com", 1), false},
		{"condition value set",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"StringEquals":{"aws:RequestedRegion":["eu-west-1","eu-west-2"]}}}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"StringEquals":{"aws:RequestedRegion":["eu-west-2","eu-west-1","eu-west-1"]}}}]}`, true},
		{"condition booleans and numbers as strings",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Deny","Action":"*","Resource":"*","Condition":{"Bool":{"aws:SecureTransport":false},"NumericLessThan":{"s3:max-keys":10}}}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Deny","Action":"*","Resource":"*","Condition":{"Bool":{"aws:SecureTransport":["false"]},"NumericLessThan":{"s3:max-keys":"10"}}}]}`, true},
		{"principal sets per type",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["arn:aws:iam::1:root","arn:aws:iam::2:root"],"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":["ec2.amazonaws.com"],"AWS":["arn:aws:iam::2:root","arn:aws:iam::1:root"]},"Action":"sts:AssumeRole"}]}`, true},
		{"principal type matters",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"x"},"Action":"sts:AssumeRole"}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"x"},"Action":"sts:AssumeRole"}]}`, false},
		{"principal star is a string",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*","Action":"sts:AssumeRole"}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"*"},"Action":"sts:AssumeRole"}]}`, false},
		{"NotPrincipal vs Principal",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Deny","Principal":{"AWS":"x"},"Action":"*"}]}`,
			`{"Version":"2012-10-17","Statement":[{"Effect":"Deny","NotPrincipal":{"AWS":"x"},"Action":"*"}]}`, false},
		{"empty objects", `{}`, " {} ", true},
		{"empty vs 2008", `{}`, `{"Version":"2008-10-17"}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pair := range [][2]string{{tc.a, tc.b}, {tc.b, tc.a}} {
				got, err := Equivalent(pair[0], pair[1])
				if err != nil || got != tc.want {
					t.Fatalf("Equivalent(\n%s,\n%s) = %v, %v; want %v", pair[0], pair[1], got, err, tc.want)
				}
			}
		})
	}
}

func TestEquivalentErrors(t *testing.T) {
	valid := `{"Version":"2012-10-17","Statement":[]}`
	for _, bad := range []string{
		"",
		"   ",
		"[]",
		`"x"`,
		"null",
		"{",
		`{"a":1} {"b":2}`,
		`{"a":1}}`,
		"%7B", // URL-encoded, but not JSON
		"%ZZ", // not even URL encoding
		percentEncode("[1]"),
		"%257B%257D", // encoded twice
	} {
		if got, err := Equivalent(bad, valid); err == nil || got || !strings.HasPrefix(err.Error(), "first") {
			t.Errorf("Equivalent(%q, valid) = %v, %v; want an error about the first document", bad, got, err)
		}
		if got, err := Equivalent(valid, bad); err == nil || got || !strings.HasPrefix(err.Error(), "second") {
			t.Errorf("Equivalent(valid, %q) = %v, %v; want an error about the second document", bad, got, err)
		}
	}
}

// remarshal decodes a JSON document and encodes it again with sorted keys, compact and indented.
func remarshal(t *testing.T, s string) (compact, indented string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	c, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	ind, err := json.MarshalIndent(v, "\t", "   ")
	if err != nil {
		t.Fatal(err)
	}
	return string(c), string(ind)
}

func FuzzEquivalent(f *testing.F) {
	seeds := []string{
		`{}`,
		`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::bucket/*"]}]}`,
		`{"Version":"2012-10-17","Statement":{"Effect":"Allow","Action":"S3:GetObject","Resource":"arn:aws:s3:::bucket/*"}}`,
		`{"Statement":[{"Effect":"Deny","NotAction":["iam:*","iam:*"],"NotResource":"*","Condition":{"Bool":{"aws:SecureTransport":false,"AWS:securetransport":"true"}}}]}`,
		`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Federated":"arn:aws:iam::1:oidc-provider/x"},"Action":"sts:AssumeRoleWithWebIdentity","Condition":{"StringEquals":{"x:sub":"system:serviceaccount:a:b","x:aud":"sts.amazonaws.com"}}}]}`,
		`{"Statement":[{"Principal":"*","Action":[],"Resource":[[1,2],{"b":1,"a":[null]}]},7,"x",[]],"Other":{"z":1e3,"y":-0.5,"x":"\u00e9\u0026"}}`,
		`{"Statement":[{"Condition":{"Op":"not an object","Op2":{"k":[true,1,"1",null,{"a":1}]}}}]}`,
		` {"a":"b"} `,
		"[]",
		"%7B%7D",
		"",
	}
	for i, a := range seeds {
		f.Add(a, seeds[(i+1)%len(seeds)])
	}
	f.Add(seeds[1], iamEncoded(seeds[1]))
	f.Fuzz(func(t *testing.T, a, b string) {
		ab, errAB := Equivalent(a, b)
		ba, errBA := Equivalent(b, a)
		if ab != ba || (errAB == nil) != (errBA == nil) {
			t.Fatalf("not symmetric: Equivalent(a, b) = %v, %v; Equivalent(b, a) = %v, %v", ab, errAB, ba, errBA)
		}
		if json.Valid([]byte(a)) {
			// URL-encoding one side, as IAM does, changes nothing.
			if got, err := Equivalent(percentEncode(a), b); got != ab || (err == nil) != (errAB == nil) {
				t.Fatalf("Equivalent(percentEncode(a), b) = %v, %v; Equivalent(a, b) = %v, %v", got, err, ab, errAB)
			}
		}
		if !json.Valid([]byte(a)) || !strings.HasPrefix(strings.TrimLeft(a, jsonSpace), "{") {
			return
		}
		// a is a JSON object: reflexive, also across encodings and layouts.
		compact, indented := remarshal(t, a)
		for _, other := range []string{a, percentEncode(a), compact, indented, percentEncode(indented)} {
			if eq, err := Equivalent(a, other); err != nil || !eq {
				t.Fatalf("Equivalent(a, %q) = %v, %v with a = %q", other, eq, err, a)
			}
		}
		if errAB == nil {
			if got, err := Equivalent(indented, b); err != nil || got != ab {
				t.Fatalf("Equivalent(reindented a, b) = %v, %v; Equivalent(a, b) = %v", got, err, ab)
			}
		}
	})
}
