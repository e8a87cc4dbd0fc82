package iam

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awseks"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
)

// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Finalizer holds an IAMPolicy or IAMServiceAccount until its AWS objects are gone (or retained).
const Finalizer = "iam.quartermaster.dev/aws-objects"

const (
	// slowRetry is how often an error only a person can fix is checked again.
	slowRetry = 5 * time.Minute
	// waitRetry is how often a missing ServiceAccount is looked for again.
	waitRetry = 30 * time.Second
	// maxFailureBackoff is the longest wait before an object whose AWS calls failed is retried.
	maxFailureBackoff = 5 * time.Minute
	// reconcileTimeout bounds one reconcile's AWS calls (the SDK retries within it).
	reconcileTimeout = 2 * time.Minute
)

// AWS is the part of the IAM API the controller uses; *awsiam.Client implements it.
type AWS interface {
	AccountID(ctx context.Context) (string, error)
	GetPolicy(ctx context.Context, arn string) (*awsiam.Policy, error)
	GetPolicyDocument(ctx context.Context, arn, versionID string) (string, error)
	CreatePolicy(ctx context.Context, p awsiam.NewPolicy) (*awsiam.Policy, error)
	ListPolicyVersions(ctx context.Context, arn string) ([]awsiam.PolicyVersion, error)
	CreatePolicyVersion(ctx context.Context, arn, document string) (string, error)
	DeletePolicyVersion(ctx context.Context, arn, versionID string) error
	DeletePolicy(ctx context.Context, arn string) error
	ListRolesForPolicy(ctx context.Context, arn string) ([]string, error)
	GetRole(ctx context.Context, name string) (*awsiam.Role, error)
	CreateRole(ctx context.Context, r awsiam.NewRole) (*awsiam.Role, error)
	UpdateTrustPolicy(ctx context.Context, role, document string) error
	UpdateRole(ctx context.Context, role, description string, maxSessionDuration int32) error
	PutPermissionsBoundary(ctx context.Context, role, arn string) error
	DeletePermissionsBoundary(ctx context.Context, role string) error
	ListAttachedPolicies(ctx context.Context, role string) ([]string, error)
	AttachPolicy(ctx context.Context, role, arn string) error
	DetachPolicy(ctx context.Context, role, arn string) error
	ListInlinePolicies(ctx context.Context, role string) ([]string, error)
	GetInlinePolicy(ctx context.Context, role, name string) (string, error)
	PutInlinePolicy(ctx context.Context, role, name, document string) error
	DeleteInlinePolicy(ctx context.Context, role, name string) error
	StartAccessReport(ctx context.Context, arn string) (string, error)
	AccessReport(ctx context.Context, jobID string) (*awsiam.AccessReport, error)
	PoliciesGranting(ctx context.Context, arn string, namespaces []string) (map[string][]awsiam.GrantingPolicy, error)
	DeleteRole(ctx context.Context, role string) error
	TagRole(ctx context.Context, role string, tags awsiam.Tags) error
	UntagRole(ctx context.Context, role string, keys []string) error
	TagPolicy(ctx context.Context, arn string, tags awsiam.Tags) error
}

// EKS is the part of the EKS API the controller uses (Pod Identity associations);
// *awseks.Client implements it.
type EKS interface {
	Create(ctx context.Context, a awseks.NewAssociation) (*awseks.Association, error)
	Describe(ctx context.Context, cluster, id string) (*awseks.Association, error)
	Update(ctx context.Context, a *awseks.Association, roleARN string, t awseks.Target) (*awseks.Association, error)
	Delete(ctx context.Context, cluster, id string) error
	Find(ctx context.Context, cluster, namespace, serviceAccount string) ([]awseks.Association, error)
	Tag(ctx context.Context, arn string, tags map[string]string) error
}

// base is what both reconcilers share.
type base struct {
	client    client.Client
	apiReader client.Reader // ServiceAccounts are read uncached (the shared cache may be narrowed to other controllers' labels)
	recorder  events.EventRecorder
	aws       AWS
	eks       EKS // called only for IAMServiceAccounts whose mechanism includes Pod Identity (or did)
	cfg       config

	// SlowRetry and WaitRetry are fields so tests can shorten them, as is MaxFailureBackoff, the
	// longest wait between retries of a failing object.
	SlowRetry         time.Duration
	WaitRetry         time.Duration
	MaxFailureBackoff time.Duration
	// accessPoll is how often a running last-accessed job of IAM is looked at.
	accessPoll time.Duration
	// sharedSettle is how long after writing a shared role's trust policy it is read again
	// (sharedSettleTime; tests shorten it).
	sharedSettle time.Duration
	// sharedWriters serializes this manager's trust writes of one shared role.
	sharedWriters keyedMutex

	accountMu sync.Mutex
	account   string
}

// step ends every reconcile (status.Step): the guarded client, the recorder.
func (b *base) step() status.Step { return status.Step{Client: b.client, Recorder: b.recorder} }

// accountID is --aws-account-id, or the caller's account learnt once from STS.
func (b *base) accountID(ctx context.Context) (string, error) {
	b.accountMu.Lock()
	defer b.accountMu.Unlock()
	if b.account != "" {
		return b.account, nil
	}
	if b.cfg.accountID != "" {
		b.account = b.cfg.accountID
		return b.account, nil
	}
	id, err := b.aws.AccountID(ctx)
	if err != nil {
		return "", fmt.Errorf("learning the AWS account from STS GetCallerIdentity (or set --aws-account-id): %w", err)
	}
	b.account = id
	return id, nil
}

// expectedPolicyARN is the ARN the IAMPolicy namespace/name has in AWS: names are unique per
// account, the path is ours.
func (b *base) expectedPolicyARN(ctx context.Context, p *iamv1alpha1.IAMPolicy) (string, error) {
	account, err := b.accountID(ctx)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("arn:%s:iam::%s:policy%s%s", b.cfg.partition, account, b.policyPath(p), irsa.PolicyName(p.Namespace, p.Name)), nil
}

// policyPath is where an IAMPolicy's AWS policy is: the operator's path, or the path an adopted
// policy was created with (its adopt annotation).
func (b *base) policyPath(p *iamv1alpha1.IAMPolicy) string {
	if path, ok := irsa.AdoptPath(p.Annotations[iamv1alpha1.AnnotationAdopt], b.cfg.cluster); ok {
		return path
	}
	return irsa.Path(b.cfg.cluster)
}

// adopt tags an AWS object found under the generated name without the object's tags (tags, as
// read; nil for none), when the object asks for it (AnnotationAdopt) and no other Quartermaster
// object owns it; otherwise it is a Conflict, whose message says why. what is "IAM role NAME" or
// "IAM policy ARN". tags are only read: nothing after an adoption looks at them again.
func (b *base) adopt(obj client.Object, what string, tags map[string]string, tag func(awsiam.Tags) error) (bool, status.Outcome) {
	switch {
	case irsa.TaggedByQuartermaster(tags):
		return false, status.WaitsForPerson(ReasonConflict, fmt.Sprintf(
			"%s exists and is tagged as another Quartermaster object's (%s=%s, %s=%s, %s=%s); it is left alone and cannot be adopted",
			what, irsa.TagCluster, tags[irsa.TagCluster], irsa.TagNamespace, tags[irsa.TagNamespace], irsa.TagName, tags[irsa.TagName]), b.SlowRetry)
	case obj.GetAnnotations()[iamv1alpha1.AnnotationAdopt] == "":
		return false, status.WaitsForPerson(ReasonConflict, fmt.Sprintf(
			"%s exists without Quartermaster's tags; it is left alone (annotate %s=true to adopt it: the operator tags it and manages it from then on)",
			what, iamv1alpha1.AnnotationAdopt), b.SlowRetry)
	}
	if err := tag(irsa.Tags(b.cfg.cluster, obj.GetNamespace(), obj.GetName())); err != nil {
		return false, awsFailure(err, b.SlowRetry)
	}
	b.recorder.Eventf(obj, nil, corev1.EventTypeNormal, "Adopted", "Adopt", "adopted %s: tagged as this object's", what)
	return true, status.Outcome{}
}

// Setup registers the iam controllers with the manager, with AWS calls made through the SDK's
// standard configuration (region, credentials chain, AWS_ENDPOINT_URL_IAM, _EKS and friends),
// one configuration for IAM, STS and EKS.
func Setup(mgr ctrl.Manager, cfg config) error {
	awsCfg, err := awsiam.LoadConfig(context.Background())
	if err != nil {
		return fmt.Errorf("loading the AWS configuration: %w", err)
	}
	return setup(mgr, cfg, awsiam.New(awsCfg), awseks.New(awsCfg))
}

// SetupWithAWS validates the options and registers the controllers with IAM calls going through
// api and EKS calls through eks (tests and the benchmark point them at the IAM emulator).
func SetupWithAWS(mgr ctrl.Manager, o *Options, api AWS, eks EKS) error {
	cfg, err := o.validate()
	if err != nil {
		return err
	}
	return setup(mgr, cfg, api, eks)
}

func setup(mgr ctrl.Manager, cfg config, api AWS, eks EKS) error {
	b, err := newBase(mgr, cfg, api, eks)
	if err != nil {
		return err
	}
	return register(mgr, b)
}

func newBase(mgr ctrl.Manager, cfg config, api AWS, eks EKS) (*base, error) {
	if _, _, err := mgr.GetScheme().ObjectKinds(&iamv1alpha1.IAMPolicy{}); err != nil {
		return nil, errors.New("the manager's scheme lacks iam.quartermaster.dev/v1alpha1 (add iamv1alpha1.AddToScheme)")
	}
	recorder, err := newQuietRecorder(mgr, status.NewRecorder(mgr, "quartermaster-iam"))
	if err != nil {
		return nil, err
	}
	return &base{
		client:            guarded(owned.WithFieldOwner(mgr.GetClient())),
		apiReader:         mgr.GetAPIReader(),
		recorder:          recorder,
		aws:               api,
		eks:               eks,
		cfg:               cfg,
		SlowRetry:         slowRetry,
		WaitRetry:         waitRetry,
		MaxFailureBackoff: maxFailureBackoff,
		accessPoll:        10 * time.Second,
		sharedSettle:      sharedSettleTime,
	}, nil
}

// guarded is c reading no IAMPolicy or IAMServiceAccount older than the controllers' own last
// write of it: their status drives Events, and an IAMPolicy's ARN the attachments. (The compat
// mode's ConfigMaps come from a cache of their own; it re-reads one from the API server before
// writing its annotations.)
func guarded(c client.Client) client.Client {
	return status.NewClient(c, &iamv1alpha1.IAMPolicy{}, &iamv1alpha1.IAMServiceAccount{})
}

// register adds the controllers sharing b to the manager.
func register(mgr ctrl.Manager, b *base) error {
	if b.cfg.issuer == "" {
		mgr.GetLogger().WithName(Name).Info("--oidc-issuer is not set: IAMServiceAccounts with mechanism IRSA or Both stall (" + ReasonOIDCIssuerNotSet + "); PodIdentity ones run")
	}
	status.CountObjects(mgr, "IAMPolicy", &iamv1alpha1.IAMPolicyList{}, status.ConditionState)
	status.CountObjects(mgr, "IAMServiceAccount", &iamv1alpha1.IAMServiceAccountList{}, status.ConditionState)
	if b.cfg.unusedAfter > 0 {
		if err := registerUnusedMetric(mgr); err != nil {
			return err
		}
	}
	if err := indexReferences(mgr); err != nil {
		return err
	}
	if err := (&PolicyReconciler{base: b}).setupWithManager(mgr); err != nil {
		return err
	}
	if err := (&ServiceAccountReconciler{base: b}).setupWithManager(mgr); err != nil {
		return err
	}
	if b.cfg.compat {
		return (&CompatReconciler{base: b}).setupWithManager(mgr)
	}
	return nil
}

// controllerOptions: AWS errors back off from 1 s to MaxFailureBackoff (5 min, not the default
// 16 min, so objects recover soon after AWS does).
func (b *base) controllerOptions() controller.Options {
	return controller.Options{
		MaxConcurrentReconciles: b.cfg.concurrency,
		ReconciliationTimeout:   reconcileTimeout,
		RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Second, b.MaxFailureBackoff),
	}
}
