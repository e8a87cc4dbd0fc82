// Package awseks is the iam controller's thin adapter over the AWS SDK for Go v2's EKS client:
// EKS Pod Identity associations (create, describe, change the role, delete, find the one of a
// ServiceAccount) and their tags, in plain Go types. It holds no business logic: which association
// a ServiceAccount should have, and when, is the controller's.
//
// It is configured like the IAM client (awsiam.LoadConfig: region, credentials chain,
// AWS_ENDPOINT_URL_EKS, CA bundle, the retryer, the per-attempt timeout) and its calls are counted
// in quartermaster_external_requests_total{service="eks"}. Errors are *awsiam.Error with Service
// "eks"; IsNotFound and IsInUse classify them, and awsiam.IsThrottleOrServer still applies.
package awseks

import (
	"context"
	"maps"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eks"
	"github.com/aws/aws-sdk-go-v2/service/eks/types"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
)

// Client calls EKS. It is safe for concurrent use.
type Client struct {
	eks *eks.Client
}

// New returns a client over cfg (usually from awsiam.LoadConfig). The EKS client resolves its
// endpoint from cfg, including cfg.BaseEndpoint and AWS_ENDPOINT_URL_EKS.
func New(cfg aws.Config) *Client {
	return &Client{eks: eks.NewFromConfig(cfg, func(o *eks.Options) { o.APIOptions = append(o.APIOptions, awsiam.Metered("eks")) })}
}

// Association is an EKS Pod Identity association: pods of ServiceAccount Namespace/ServiceAccount
// in Cluster get RoleARN's credentials.
type Association struct {
	ID, ARN                            string
	Cluster, Namespace, ServiceAccount string
	RoleARN                            string
	Target                             Target
	// ExternalID is what the target role's trust policy must require (sts:ExternalId); "" without
	// a target.
	ExternalID string
	// Tags are the association's tags; nil from Find, which EKS answers without them.
	Tags map[string]string
}

// Target is where an association's credentials lead beyond its role: a target role EKS assumes
// with the role's credentials (cross-account access), and whether EKS adds its session tags.
type Target struct {
	RoleARN            string // "" for none: pods get the association's role
	DisableSessionTags bool
}

// NewAssociation is an association to create.
type NewAssociation struct {
	Cluster, Namespace, ServiceAccount, RoleARN string
	Target                                      Target
	Tags                                        map[string]string
}

// Create creates an association. EKS allows one per ServiceAccount: a second is
// ResourceInUseException (IsInUse). The SDK sends one idempotency token for all attempts of the
// call, so a retried request whose first answer was lost does not fail on its own association.
func (c *Client) Create(ctx context.Context, a NewAssociation) (*Association, error) {
	out, err := c.eks.CreatePodIdentityAssociation(ctx, &eks.CreatePodIdentityAssociationInput{
		ClusterName:    aws.String(a.Cluster),
		Namespace:      aws.String(a.Namespace),
		ServiceAccount: aws.String(a.ServiceAccount),
		RoleArn:        aws.String(a.RoleARN),
		Tags:           maps.Clone(a.Tags),
		// Sent only when set, so the common request stays as EKS has always received it.
		TargetRoleArn:      optional(a.Target.RoleARN),
		DisableSessionTags: optionalTrue(a.Target.DisableSessionTags),
	})
	if err != nil {
		return nil, eksErr("CreatePodIdentityAssociation", err, a.Cluster, a.Namespace+"/"+a.ServiceAccount)
	}
	return associationFrom(out.Association), nil
}

// Describe returns the association with its role and tags.
func (c *Client) Describe(ctx context.Context, cluster, id string) (*Association, error) {
	out, err := c.eks.DescribePodIdentityAssociation(ctx, &eks.DescribePodIdentityAssociationInput{
		ClusterName: aws.String(cluster), AssociationId: aws.String(id),
	})
	if err != nil {
		return nil, eksErr("DescribePodIdentityAssociation", err, cluster, id)
	}
	return associationFrom(out.Association), nil
}

// Update points association a at a role and a target. The target role is sent when there is one,
// or as "" to remove a's; the session tags switch is sent as given.
func (c *Client) Update(ctx context.Context, a *Association, roleARN string, t Target) (*Association, error) {
	in := &eks.UpdatePodIdentityAssociationInput{
		ClusterName: aws.String(a.Cluster), AssociationId: aws.String(a.ID), RoleArn: aws.String(roleARN),
		DisableSessionTags: aws.Bool(t.DisableSessionTags),
	}
	if t.RoleARN != "" || a.Target.RoleARN != "" {
		in.TargetRoleArn = aws.String(t.RoleARN)
	}
	cluster, id := a.Cluster, a.ID
	out, err := c.eks.UpdatePodIdentityAssociation(ctx, in)
	if err != nil {
		return nil, eksErr("UpdatePodIdentityAssociation", err, cluster, id)
	}
	return associationFrom(out.Association), nil
}

// Delete deletes the association.
func (c *Client) Delete(ctx context.Context, cluster, id string) error {
	_, err := c.eks.DeletePodIdentityAssociation(ctx, &eks.DeletePodIdentityAssociationInput{
		ClusterName: aws.String(cluster), AssociationId: aws.String(id),
	})
	return eksErr("DeletePodIdentityAssociation", err, cluster, id)
}

// Find returns the associations of ServiceAccount namespace/serviceAccount in cluster (all pages;
// EKS allows at most one), without their roles and tags: Describe one for those.
func (c *Client) Find(ctx context.Context, cluster, namespace, serviceAccount string) ([]Association, error) {
	var out []Association
	pager := eks.NewListPodIdentityAssociationsPaginator(c.eks, &eks.ListPodIdentityAssociationsInput{
		ClusterName: aws.String(cluster), Namespace: aws.String(namespace), ServiceAccount: aws.String(serviceAccount),
	})
	for pager.HasMorePages() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, eksErr("ListPodIdentityAssociations", err, cluster, namespace+"/"+serviceAccount)
		}
		for _, s := range page.Associations {
			out = append(out, Association{
				ID: aws.ToString(s.AssociationId), ARN: aws.ToString(s.AssociationArn), Cluster: aws.ToString(s.ClusterName),
				Namespace: aws.ToString(s.Namespace), ServiceAccount: aws.ToString(s.ServiceAccount),
			})
		}
	}
	return out, nil
}

// Tag adds tags to an EKS resource (an association's ARN), overwriting the values of keys it
// already has. Empty tags make no call.
func (c *Client) Tag(ctx context.Context, arn string, tags map[string]string) error {
	if len(tags) == 0 {
		return nil
	}
	_, err := c.eks.TagResource(ctx, &eks.TagResourceInput{ResourceArn: aws.String(arn), Tags: maps.Clone(tags)})
	return eksErr("TagResource", err, arn)
}

// IsNotFound reports whether err is EKS's ResourceNotFoundException (no such association, or no
// such cluster).
func IsNotFound(err error) bool { return awsiam.ErrorCode(err) == "ResourceNotFoundException" }

// IsInUse reports whether err is EKS's ResourceInUseException: the ServiceAccount already has an
// association.
func IsInUse(err error) bool { return awsiam.ErrorCode(err) == "ResourceInUseException" }

// IsInvalidParameter reports whether err is EKS's InvalidParameterException, which is also its
// answer for a role its view of IAM does not show yet ("Role provided in the request does not
// exist", "Trust policy of the role provided is invalid").
func IsInvalidParameter(err error) bool { return awsiam.ErrorCode(err) == "InvalidParameterException" }

func eksErr(op string, err error, resource ...string) error {
	if err == nil {
		return nil
	}
	return &awsiam.Error{Service: "eks", Operation: op, Resource: resource, Err: err}
}

func associationFrom(a *types.PodIdentityAssociation) *Association {
	if a == nil {
		return &Association{}
	}
	return &Association{
		ID: aws.ToString(a.AssociationId), ARN: aws.ToString(a.AssociationArn), Cluster: aws.ToString(a.ClusterName),
		Namespace: aws.ToString(a.Namespace), ServiceAccount: aws.ToString(a.ServiceAccount), RoleARN: aws.ToString(a.RoleArn),
		Target:     Target{RoleARN: aws.ToString(a.TargetRoleArn), DisableSessionTags: aws.ToBool(a.DisableSessionTags)},
		ExternalID: aws.ToString(a.ExternalId),
		Tags:       maps.Clone(a.Tags),
	}
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return aws.String(s)
}

func optionalTrue(b bool) *bool {
	if !b {
		return nil
	}
	return aws.Bool(true)
}
