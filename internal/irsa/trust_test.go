package irsa

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestNormalizeIssuer(t *testing.T) {
	const want = "oidc.eks.eu-west-1.amazonaws.com/id/ABC"
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"https://oidc.eks.eu-west-1.amazonaws.com/id/ABC", want, true},
		{"https://oidc.eks.eu-west-1.amazonaws.com/id/ABC/", want, true},
		{"oidc.eks.eu-west-1.amazonaws.com/id/ABC", want, true},
		{"oidc.eks.eu-west-1.amazonaws.com/id/ABC/", want, true},
		{"  HTTPS://oidc.eks.eu-west-1.amazonaws.com/id/ABC//\n", want, true},
		{"https://issuer.example.com", "issuer.example.com", true},
		{"https://issuer.example.com:8443/x", "issuer.example.com:8443/x", true},
		{"", "", false},
		{"   ", "", false},
		{"http://oidc.eks.eu-west-1.amazonaws.com/id/ABC", "", false},
		{"ftp://issuer.example.com", "", false},
		{"https://issuer.example.com/?a=b", "", false},
		{"https://issuer.example.com/x?", "", false},
		{"https://issuer.example.com/x#frag", "", false},
		{"https://user:pass@issuer.example.com/x", "", false},
		{"user@issuer.example.com/x", "", false},
		{"https://", "", false},
		{"https:///id/ABC", "", false},
		{"https://issuer example.com", "", false},
		{"https://issuér.example.com", "", false},
		{"https://issuer.example.com:port/x", "", false},
	} {
		got, err := NormalizeIssuer(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("NormalizeIssuer(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && len(tc.in) > 8 && strings.Contains(err.Error(), strings.TrimSpace(tc.in)) {
			t.Errorf("NormalizeIssuer(%q) error repeats the input: %v", tc.in, err)
		}
	}
}

func TestProviderARN(t *testing.T) {
	for _, tc := range []struct{ partition, issuer, want string }{
		{"aws", "oidc.eks.eu-west-1.amazonaws.com/id/ABC", "arn:aws:iam::123456789012:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/ABC"},
		{"aws-cn", "oidc.eks.cn-north-1.amazonaws.com.cn/id/ABC", "arn:aws-cn:iam::123456789012:oidc-provider/oidc.eks.cn-north-1.amazonaws.com.cn/id/ABC"},
		// The URL form gives the same ARN as the normalized one.
		{"aws", "https://oidc.eks.eu-west-1.amazonaws.com/id/ABC/", "arn:aws:iam::123456789012:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/ABC"},
	} {
		if got := ProviderARN(tc.partition, "123456789012", tc.issuer); got != tc.want {
			t.Errorf("ProviderARN(%q, %q) = %q, want %q", tc.partition, tc.issuer, got, tc.want)
		}
	}
}

func TestTrustPolicy(t *testing.T) {
	const golden = `{"Version":"2012-10-17","Statement":[{"Effect":"Allow",` +
		`"Principal":{"Federated":"arn:aws:iam::123456789012:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/ABC"},` +
		`"Action":"sts:AssumeRoleWithWebIdentity",` +
		`"Condition":{"StringEquals":{` +
		`"oidc.eks.eu-west-1.amazonaws.com/id/ABC:aud":"sts.amazonaws.com",` +
		`"oidc.eks.eu-west-1.amazonaws.com/id/ABC:sub":"system:serviceaccount:team-a:app"}}}]}`
	for _, issuer := range []string{"oidc.eks.eu-west-1.amazonaws.com/id/ABC", "https://oidc.eks.eu-west-1.amazonaws.com/id/ABC/"} {
		got := TrustPolicy("aws", "123456789012", issuer, "team-a", "app", Parts{Annotation: true})
		if got != golden {
			t.Errorf("TrustPolicy(issuer %q) =\n%s\nwant\n%s", issuer, got, golden)
		}
	}
	if !json.Valid([]byte(golden)) {
		t.Fatal("golden trust policy is not JSON")
	}
	// What IAM returns for it (URL-encoded, its own layout) is Equivalent, so no rewrite follows.
	iam := "%7B%22Version%22%3A%222012-10-17%22%2C%22Statement%22%3A%5B%7B%22Effect%22%3A%22Allow%22%2C%22Principal%22%3A%7B%22Federated%22%3A%22arn%3Aaws%3Aiam%3A%3A123456789012%3Aoidc-provider%2Foidc.eks.eu-west-1.amazonaws.com%2Fid%2FABC%22%7D%2C%22Action%22%3A%22sts%3AAssumeRoleWithWebIdentity%22%2C%22Condition%22%3A%7B%22StringEquals%22%3A%7B%22oidc.eks.eu-west-1.amazonaws.com%2Fid%2FABC%3Asub%22%3A%22system%3Aserviceaccount%3Ateam-a%3Aapp%22%2C%22oidc.eks.eu-west-1.amazonaws.com%2Fid%2FABC%3Aaud%22%3A%22sts.amazonaws.com%22%7D%7D%7D%5D%7D"
	if eq, err := Equivalent(golden, iam); err != nil || !eq {
		t.Errorf("Equivalent(trust policy, as IAM returns it) = %v, %v", eq, err)
	}
	// Another ServiceAccount gets another policy.
	if other := TrustPolicy("aws", "123456789012", "oidc.eks.eu-west-1.amazonaws.com/id/ABC", "team-a", "app2", Parts{Annotation: true}); other == golden {
		t.Error("TrustPolicy ignores the ServiceAccount")
	}
}

func TestPartitionOf(t *testing.T) {
	for _, tc := range []struct{ arn, want string }{
		{"arn:aws:sts::123456789012:assumed-role/x/y", "aws"},
		{"arn:aws-cn:iam::123456789012:role/x", "aws-cn"},
		{"arn:aws-us-gov:iam::123456789012:user/x", "aws-us-gov"},
		{"", "aws"},
		{"not-an-arn", "aws"},
		{"arn::iam::123456789012:role/x", "aws"},
	} {
		if got := PartitionOf(tc.arn); got != tc.want {
			t.Errorf("PartitionOf(%q) = %q, want %q", tc.arn, got, tc.want)
		}
	}
}
