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
	// Tags are the association's tags; nil from Find, which EKS answers without them.
	Tags map[string]string
}

// NewAssociation is an association to create.
type NewAssociation struct {
	Cluster, Namespace, ServiceAccount, RoleARN string
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

// SetRole points the association at another role.
func (c *Client) SetRole(ctx context.Context, cluster, id, roleARN string) (*Association, error) {
	out, err := c.eks.UpdatePodIdentityAssociation(ctx, &eks.UpdatePodIdentityAssociationInput{
		ClusterName: aws.String(cluster), AssociationId: aws.String(id), RoleArn: aws.String(roleARN),
	})
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
		Tags: maps.Clone(a.Tags),
	}
}
