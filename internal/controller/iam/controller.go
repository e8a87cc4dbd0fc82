// Package iam is the "iam" controller: IAMPolicy objects become AWS IAM customer-managed policies,
// IAMServiceAccount objects become IAM roles that one ServiceAccount gets through the cluster's
// OIDC provider (IRSA), an EKS Pod Identity association, or both, and with --iam-configmap-compat
// the legacy iam-config ConfigMaps are translated into those two kinds.
package iam

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
)

// Name is the controller's name in --controllers.
const Name = "iam"

// Options are the controller's flags.
type Options struct {
	ClusterName         string
	EKSClusterName      string
	OIDCIssuer          string
	AccountID           string
	Partition           string
	AllowedPolicyARNs   string
	PermissionsBoundary string
	Resync              time.Duration
	ConfigMapCompat     bool
	Concurrency         int
	// UnusedAfter is how long a granted service or action may go unused before an
	// IAMServiceAccount's status lists it (0: no access report).
	UnusedAfter time.Duration
	// SharedRoleNamespaces are the namespaces (comma list, * globs) whose IAMServiceAccounts may
	// use spec.sharedRole.
	SharedRoleNamespaces string
}

// AddFlags registers the controller's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.ClusterName, "cluster-name", "",
		"Name of this cluster in AWS: the IAM path /quartermaster/<name>/ and the quartermaster.dev/cluster tag of every IAM object the iam controller creates. The iam controller is off without it.")
	fs.StringVar(&o.EKSClusterName, "eks-cluster-name", "",
		"Name of the EKS cluster in which IAMServiceAccounts with spec.mechanism PodIdentity or Both get their Pod Identity associations (default: --cluster-name).")
	fs.StringVar(&o.OIDCIssuer, "oidc-issuer", "",
		"The cluster's OIDC issuer URL (e.g. https://oidc.eks.eu-west-1.amazonaws.com/id/ABC), federated in the trust policies of roles used through IRSA. Without it only IAMServiceAccounts with spec.mechanism PodIdentity run; IRSA and Both ones stall (OIDCIssuerNotSet).")
	fs.StringVar(&o.AccountID, "aws-account-id", "", "AWS account of the OIDC provider (default: the caller's, from STS GetCallerIdentity).")
	fs.StringVar(&o.Partition, "aws-partition", "aws", "AWS partition of ARNs: aws, aws-cn or aws-us-gov.")
	fs.StringVar(&o.AllowedPolicyARNs, "allowed-policy-arns", "",
		"Comma list of ARN patterns (* matches anything) that spec.managedPolicyArns may name, e.g. arn:aws:iam::aws:policy/ReadOnlyAccess. Empty: none.")
	fs.StringVar(&o.PermissionsBoundary, "permissions-boundary", "",
		"ARN of a managed policy set as permissions boundary of every role, overriding spec.permissionsBoundaryArn.")
	fs.DurationVar(&o.Resync, "iam-resync", time.Hour, "How often each IAM object is re-read from AWS and repaired (jittered by 10%). No IAM calls happen in between.")
	fs.BoolVar(&o.ConfigMapCompat, "iam-configmap-compat", false,
		"Also translate ConfigMaps named iam-config (keys policies.yaml, serviceaccount_attachments.yaml) into IAMPolicy and IAMServiceAccount objects.")
	fs.IntVar(&o.Concurrency, "iam-concurrency", 8, "IAMPolicies and IAMServiceAccounts reconciled in parallel (each).")
	fs.DurationVar(&o.UnusedAfter, "iam-unused-after", 0,
		"Report in each IAMServiceAccount's status.accessReport the granted services and actions its role has not used for this long, from IAM's last-accessed information (read at most once per --iam-resync), e.g. 2160h for 90 days. 0: off.")
	fs.StringVar(&o.SharedRoleNamespaces, "iam-shared-role-namespaces", "",
		"Comma list of the namespaces (* matches any part of a name, e.g. platform-*) whose IAMServiceAccounts may use spec.sharedRole: a role shared with other clusters, reached by whoever its owner lists. Empty: none; an IAMServiceAccount elsewhere stalls (SharedRoleNotAllowed) and its statements are taken out of the role.")
}

var (
	accountIDPattern = regexp.MustCompile(`^[0-9]{12}$`)
	policyARNPattern = regexp.MustCompile(`^arn:aws[a-z-]*:iam::(aws|[0-9]{12}):policy/.+$`)
	// sharedNamespacePattern is a namespace name with * anywhere.
	sharedNamespacePattern = regexp.MustCompile(`^[a-z0-9*-]{1,63}$`)
)

// config is the validated form of the flags.
type config struct {
	cluster string
	// eksCluster is where Pod Identity associations are made; eksClusterErr says why it cannot be
	// used when it defaulted to a --cluster-name that is no EKS cluster name (only the objects that
	// need an association stall on it).
	eksCluster    string
	eksClusterErr error
	issuer        string // without scheme; "" when not set (only Pod Identity works, see withoutIssuer)
	accountID     string // "" until learnt from STS
	partition     string
	allowed       irsa.Patterns
	boundary      string
	resync        time.Duration
	unusedAfter   time.Duration
	compat        bool
	concurrency   int
	// sharedNamespaces are --iam-shared-role-namespaces' patterns.
	sharedNamespaces []string
}

// validate reports, naming the flag, why the controller cannot run.
func (o *Options) validate() (config, error) {
	if o.ClusterName == "" {
		return config{}, errors.New("--cluster-name is not set: name this cluster for the IAM path and tags")
	}
	if err := irsa.ValidClusterName(o.ClusterName); err != nil {
		return config{}, err
	}
	eksCluster, eksClusterErr := o.EKSClusterName, error(nil)
	if eksCluster != "" {
		if err := irsa.ValidEKSClusterName(eksCluster, "--eks-cluster-name"); err != nil {
			return config{}, err
		}
	} else {
		eksCluster = o.ClusterName
		if err := irsa.ValidEKSClusterName(eksCluster, "--cluster-name"); err != nil {
			eksClusterErr = fmt.Errorf("%w; set --eks-cluster-name to the EKS cluster's name for Pod Identity associations", err)
		}
	}
	// Optional: a cluster that uses only EKS Pod Identity has no OIDC provider to trust.
	var issuer string
	if o.OIDCIssuer != "" {
		var err error
		if issuer, err = irsa.NormalizeIssuer(o.OIDCIssuer); err != nil {
			return config{}, fmt.Errorf("--oidc-issuer: %w", err)
		}
	}
	if o.AccountID != "" && !accountIDPattern.MatchString(o.AccountID) {
		return config{}, fmt.Errorf("--aws-account-id %q must be 12 digits", o.AccountID)
	}
	switch o.Partition {
	case "aws", "aws-cn", "aws-us-gov":
	default:
		return config{}, fmt.Errorf("--aws-partition %q must be aws, aws-cn or aws-us-gov", o.Partition)
	}
	var patterns []string
	for p := range strings.SplitSeq(o.AllowedPolicyARNs, ",") {
		if p = strings.TrimSpace(p); p != "" {
			patterns = append(patterns, p)
		}
	}
	allowed, err := irsa.ParsePatterns(patterns)
	if err != nil {
		return config{}, fmt.Errorf("--allowed-policy-arns: %w", err)
	}
	if o.PermissionsBoundary != "" && !policyARNPattern.MatchString(o.PermissionsBoundary) {
		return config{}, fmt.Errorf("--permissions-boundary %q is not a policy ARN", o.PermissionsBoundary)
	}
	var sharedNamespaces []string
	for p := range strings.SplitSeq(o.SharedRoleNamespaces, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !sharedNamespacePattern.MatchString(p) {
			return config{}, fmt.Errorf("--iam-shared-role-namespaces: %q is not a namespace name or a pattern of one (lower-case letters, digits, - and *)", p)
		}
		sharedNamespaces = append(sharedNamespaces, p)
	}
	switch {
	case o.Resync <= 0:
		return config{}, errors.New("--iam-resync must be positive")
	case o.Concurrency < 1:
		return config{}, errors.New("--iam-concurrency must be at least 1")
	case o.UnusedAfter < 0:
		return config{}, errors.New("--iam-unused-after must not be negative")
	}
	return config{
		cluster: o.ClusterName, eksCluster: eksCluster, eksClusterErr: eksClusterErr, issuer: issuer, accountID: o.AccountID, partition: o.Partition,
		allowed: allowed, boundary: o.PermissionsBoundary, resync: o.Resync, unusedAfter: o.UnusedAfter, compat: o.ConfigMapCompat,
		concurrency: o.Concurrency, sharedNamespaces: sharedNamespaces,
	}, nil
}

// Controller returns the registry entry of the iam controller. It restricts no shared cache: it
// caches only its own kinds, reads ServiceAccounts from the API server, and keeps the legacy
// ConfigMaps in a cache of its own.
func Controller() controllers.Controller {
	o := &Options{}
	return controllers.Controller{
		Name: Name,
		Requires: []schema.GroupVersionKind{
			iamv1alpha1.GroupVersion.WithKind("IAMPolicy"),
			iamv1alpha1.GroupVersion.WithKind("IAMServiceAccount"),
		},
		AddFlags: o.AddFlags,
		Configured: func() error {
			_, err := o.validate()
			return err
		},
		Setup: func(mgr ctrl.Manager, _ *controllers.Kinds) error {
			cfg, err := o.validate()
			if err != nil {
				return err
			}
			return Setup(mgr, cfg)
		},
	}
}
