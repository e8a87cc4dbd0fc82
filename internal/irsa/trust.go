package irsa

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"strings"

	awsarn "github.com/aws/aws-sdk-go-v2/aws/arn"
)

// defaultPartition is the partition of commercial AWS regions.
const defaultPartition = "aws"

// stsAudience is the audience EKS's pod identity webhook puts in projected ServiceAccount tokens.
const stsAudience = "sts.amazonaws.com"

// NormalizeIssuer turns the cluster's OIDC issuer URL, as a user or `aws eks describe-cluster`
// writes it ("https://oidc.eks.eu-west-1.amazonaws.com/id/ABC", with or without the scheme, with or
// without a trailing slash), into the form IAM uses in OIDC provider ARNs and condition keys: no
// scheme, no trailing slash. A role whose trust policy spells the issuer differently from its
// provider silently never matches, so every spelling must end up the same.
//
// Only https issuers exist in IAM, so another scheme is an error; so are a query, a fragment or
// user information, which an issuer cannot have, and characters outside printable ASCII. Errors do
// not repeat the input.
func NormalizeIssuer(issuer string) (string, error) {
	s := strings.TrimSpace(issuer)
	if s == "" {
		return "", errors.New("the OIDC issuer URL is empty")
	}
	if scheme, rest, ok := strings.Cut(s, "://"); ok {
		if !strings.EqualFold(scheme, "https") {
			return "", errors.New("the OIDC issuer URL must use https")
		}
		s = rest
	}
	for i := range len(s) {
		if s[i] <= ' ' || s[i] > '~' {
			return "", errors.New("the OIDC issuer URL has a character that is not printable ASCII")
		}
	}
	if strings.ContainsAny(s, "?#") {
		return "", errors.New("the OIDC issuer URL must not have a query or fragment")
	}
	u, err := url.Parse("https://" + s)
	if err != nil {
		return "", errors.New("the OIDC issuer URL is not a valid URL")
	}
	if u.User != nil {
		return "", errors.New("the OIDC issuer URL must not have user information")
	}
	if u.Host == "" {
		return "", errors.New("the OIDC issuer URL has no host")
	}
	return strings.TrimRight(s, "/"), nil
}

// bareIssuer strips what NormalizeIssuer strips from an issuer it already accepted, so that
// ProviderARN and TrustPolicy agree with each other even if a caller passes the URL form.
func bareIssuer(issuer string) string {
	if scheme, rest, ok := strings.Cut(issuer, "://"); ok && strings.EqualFold(scheme, "https") {
		issuer = rest
	}
	return strings.TrimRight(issuer, "/")
}

// ProviderARN is the ARN of the cluster's IAM OIDC identity provider,
// "arn:<partition>:iam::<account>:oidc-provider/<issuer>", issuer as NormalizeIssuer returns it.
func ProviderARN(partition, accountID, issuer string) string {
	return "arn:" + partition + ":iam::" + accountID + ":oidc-provider/" + bareIssuer(issuer)
}

// trustPolicy is the shape of a role trust policy; a struct (not a map) so the fields come out in
// the order AWS writes them.
type trustPolicy struct {
	Version   string           `json:"Version"`
	Statement []trustStatement `json:"Statement"`
}

type trustStatement struct {
	Sid       string                       `json:"Sid,omitempty"`
	Effect    string                       `json:"Effect"`
	Principal map[string]string            `json:"Principal"`
	Action    any                          `json:"Action"` // a string, or a list of them
	Condition map[string]map[string]string `json:"Condition,omitempty"`
}

// PodIdentityPrincipal is the service principal of EKS Pod Identity: its agent assumes the role
// with sts:AssumeRole and tags the session (sts:TagSession) with the cluster, namespace and
// ServiceAccount.
const PodIdentityPrincipal = "pods.eks.amazonaws.com"

// TrustPolicy is the trust policy of the role for ServiceAccount namespace/serviceAccount, with a
// statement for each mechanism in trust (see Plan for which ones, when):
//
//   - IRSA (trust.Annotation): only tokens the cluster's OIDC provider issued for exactly that
//     ServiceAccount, with the STS audience, may assume it. Matching the subject with StringEquals
//     (not StringLike) means no other ServiceAccount, in this namespace or another, can ever assume
//     the role.
//   - Pod Identity (trust.Association): pods.eks.amazonaws.com may assume the role and tag the
//     session. Which ServiceAccount gets the role is then decided by the association, which only the
//     operator (or whoever may call eks:CreatePodIdentityAssociation with iam:PassRole) makes.
//
// The output is deterministic (fixed field and statement order, sorted map keys), so the controller
// can compare it with what IAM holds (using Equivalent) and write only when it differs.
func TrustPolicy(partition, accountID, issuer, namespace, serviceAccount string, trust Parts) string {
	doc := trustPolicy{Version: "2012-10-17", Statement: []trustStatement{}}
	if trust.Annotation {
		iss := bareIssuer(issuer)
		doc.Statement = append(doc.Statement, trustStatement{
			Effect:    "Allow",
			Principal: map[string]string{"Federated": ProviderARN(partition, accountID, iss)},
			Action:    "sts:AssumeRoleWithWebIdentity",
			Condition: map[string]map[string]string{
				"StringEquals": {
					iss + ":sub": "system:serviceaccount:" + namespace + ":" + serviceAccount,
					iss + ":aud": stsAudience,
				},
			},
		})
	}
	if trust.Association {
		doc.Statement = append(doc.Statement, trustStatement{
			Effect:    "Allow",
			Principal: map[string]string{"Service": PodIdentityPrincipal},
			Action:    []string{"sts:AssumeRole", "sts:TagSession"},
		})
	}
	s, err := marshal(doc)
	if err != nil { // strings and maps of strings always marshal
		panic("irsa: marshal trust policy: " + err.Error())
	}
	return s
}

// PartitionOf returns the partition ("aws", "aws-cn", "aws-us-gov", …) of an ARN, such as the
// caller identity's, so that the ARNs the operator builds are right outside commercial AWS too.
// It returns "aws" when arn is not an ARN.
func PartitionOf(arn string) string {
	a, err := awsarn.Parse(arn)
	if err != nil || a.Partition == "" {
		return defaultPartition
	}
	return a.Partition
}

// marshal is json.Marshal without HTML escaping (IAM documents are not HTML; "&" stays "&") and
// without the encoder's trailing newline.
func marshal(v any) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}
