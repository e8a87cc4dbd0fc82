package iamemulator_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/eks"
	ekstypes "github.com/aws/aws-sdk-go-v2/service/eks/types"
	"github.com/aws/smithy-go"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

const (
	eksCluster = "prod"
	roleA      = "arn:aws:iam::000000000000:role/quartermaster/prod/a"
	roleB      = "arn:aws:iam::000000000000:role/quartermaster/prod/b"
)

func newEKS(t *testing.T, opts iamemulator.Options, maxAttempts int) (*env, *eks.Client) {
	t.Helper()
	opts.EKSClusters = []string{eksCluster}
	e := newEnv(t, opts, maxAttempts)
	return e, eks.NewFromConfig(e.cfg)
}

func createInput(ns, sa, role string) *eks.CreatePodIdentityAssociationInput {
	return &eks.CreatePodIdentityAssociationInput{
		ClusterName: aws.String(eksCluster), Namespace: aws.String(ns), ServiceAccount: aws.String(sa), RoleArn: aws.String(role),
	}
}

// TestPodIdentityAssociationLifecycle drives every operation through the real SDK (REST-JSON):
// create with tags, describe, change the role, tag, delete; and counts each operation.
func TestPodIdentityAssociationLifecycle(t *testing.T) {
	e, c := newEKS(t, iamemulator.Options{Seed: 7}, 1)
	ctx := ctx(t)
	in := createInput("team-a", "app", roleA)
	in.Tags = map[string]string{"quartermaster.dev/cluster": "prod"}
	created := must(c.CreatePodIdentityAssociation(ctx, in)).ok(t).Association
	id := aws.ToString(created.AssociationId)
	wantARN := "arn:aws:eks:us-east-1:000000000000:podidentityassociation/prod/" + id
	if len(id) != 19 || id[:2] != "a-" || aws.ToString(created.AssociationArn) != wantARN || aws.ToString(created.RoleArn) != roleA ||
		created.CreatedAt == nil || created.CreatedAt.IsZero() || created.Tags["quartermaster.dev/cluster"] != "prod" {
		t.Fatalf("created %+v", created)
	}

	got := must(c.DescribePodIdentityAssociation(ctx, &eks.DescribePodIdentityAssociationInput{ClusterName: aws.String(eksCluster), AssociationId: aws.String(id)})).ok(t).Association
	if aws.ToString(got.Namespace) != "team-a" || aws.ToString(got.ServiceAccount) != "app" || aws.ToString(got.ClusterName) != eksCluster {
		t.Errorf("described %+v", got)
	}

	updated := must(c.UpdatePodIdentityAssociation(ctx, &eks.UpdatePodIdentityAssociationInput{ClusterName: aws.String(eksCluster), AssociationId: aws.String(id), RoleArn: aws.String(roleB)})).ok(t).Association
	if aws.ToString(updated.RoleArn) != roleB {
		t.Errorf("updated %+v", updated)
	}

	must(c.TagResource(ctx, &eks.TagResourceInput{ResourceArn: aws.String(wantARN), Tags: map[string]string{"team": "a"}})).ok(t)
	tags := must(c.ListTagsForResource(ctx, &eks.ListTagsForResourceInput{ResourceArn: aws.String(wantARN)})).ok(t).Tags
	if tags["team"] != "a" || tags["quartermaster.dev/cluster"] != "prod" {
		t.Errorf("tags %v", tags)
	}
	if st := e.emu.State(); len(st.Associations) != 1 || st.Associations[0].RoleArn != roleB || st.Associations[0].Tags["team"] != "a" {
		t.Errorf("state %+v", st.Associations)
	}

	must(c.DeletePodIdentityAssociation(ctx, &eks.DeletePodIdentityAssociationInput{ClusterName: aws.String(eksCluster), AssociationId: aws.String(id)})).ok(t)
	_, err := c.DescribePodIdentityAssociation(ctx, &eks.DescribePodIdentityAssociationInput{ClusterName: aws.String(eksCluster), AssociationId: aws.String(id)})
	wantErr[*ekstypes.ResourceNotFoundException](t, err, "ResourceNotFoundException")
	if n := len(e.emu.State().Associations); n != 0 {
		t.Errorf("%d associations after delete", n)
	}
	for op, n := range map[string]int{
		"CreatePodIdentityAssociation": 1, "DescribePodIdentityAssociation": 2, "UpdatePodIdentityAssociation": 1,
		"TagResource": 1, "ListTagsForResource": 1, "DeletePodIdentityAssociation": 1,
	} {
		if got := e.emu.Calls(op); got != n {
			t.Errorf("Calls(%s) = %d, want %d", op, got, n)
		}
	}
}

// TestPodIdentityAssociationErrors: EKS's errors, typed by the SDK from the X-Amzn-Errortype
// header, with their HTTP statuses; none changes the state.
func TestPodIdentityAssociationErrors(t *testing.T) {
	e, c := newEKS(t, iamemulator.Options{Seed: 8}, 1)
	ctx := ctx(t)
	first := must(c.CreatePodIdentityAssociation(ctx, createInput("team-a", "app", roleA))).ok(t).Association

	status := func(err error) int {
		var re *awshttp.ResponseError
		if errors.As(err, &re) {
			return re.HTTPStatusCode()
		}
		return 0
	}
	_, err := c.CreatePodIdentityAssociation(ctx, createInput("team-a", "app", roleB))
	wantErr[*ekstypes.ResourceInUseException](t, err, "ResourceInUseException")
	if status(err) != http.StatusConflict {
		t.Errorf("duplicate: HTTP %d", status(err))
	}
	_, err = c.CreatePodIdentityAssociation(ctx, createInput("team-a", "other", "arn:aws:iam::000000000000:user/x"))
	wantErr[*ekstypes.InvalidParameterException](t, err, "InvalidParameterException")
	_, err = c.CreatePodIdentityAssociation(ctx, createInput("Team_A", "other", roleA))
	wantErr[*ekstypes.InvalidParameterException](t, err, "InvalidParameterException")
	unknown := createInput("team-a", "other", roleA)
	unknown.ClusterName = aws.String("staging")
	_, err = c.CreatePodIdentityAssociation(ctx, unknown)
	wantErr[*ekstypes.ResourceNotFoundException](t, err, "ResourceNotFoundException")
	if status(err) != http.StatusNotFound {
		t.Errorf("unknown cluster: HTTP %d", status(err))
	}
	_, err = c.UpdatePodIdentityAssociation(ctx, &eks.UpdatePodIdentityAssociationInput{ClusterName: aws.String(eksCluster), AssociationId: first.AssociationId, RoleArn: aws.String("role")})
	wantErr[*ekstypes.InvalidParameterException](t, err, "InvalidParameterException")
	_, err = c.DeletePodIdentityAssociation(ctx, &eks.DeletePodIdentityAssociationInput{ClusterName: aws.String(eksCluster), AssociationId: aws.String("a-doesnotexist00000")})
	wantErr[*ekstypes.ResourceNotFoundException](t, err, "ResourceNotFoundException")
	_, err = c.ListPodIdentityAssociations(ctx, &eks.ListPodIdentityAssociationsInput{ClusterName: aws.String(eksCluster), NextToken: aws.String("garbage!")})
	wantErr[*ekstypes.InvalidParameterException](t, err, "InvalidParameterException")

	st := e.emu.State()
	if len(st.Associations) != 1 || st.Associations[0].RoleArn != roleA {
		t.Errorf("a refused request changed the state: %+v", st.Associations)
	}
}

// TestPodIdentityAssociationIdempotency: a create retried with its client request token (as the SDK
// does when an answer is lost) gets the association it made, not ResourceInUseException.
func TestPodIdentityAssociationIdempotency(t *testing.T) {
	_, c := newEKS(t, iamemulator.Options{Seed: 9}, 1)
	ctx := ctx(t)
	in := createInput("team-a", "app", roleA)
	in.ClientRequestToken = aws.String("token-1")
	a := must(c.CreatePodIdentityAssociation(ctx, in)).ok(t).Association
	b := must(c.CreatePodIdentityAssociation(ctx, in)).ok(t).Association
	if aws.ToString(a.AssociationId) != aws.ToString(b.AssociationId) {
		t.Errorf("the retried create made %s after %s", aws.ToString(b.AssociationId), aws.ToString(a.AssociationId))
	}
	in.ClientRequestToken = aws.String("token-2")
	_, err := c.CreatePodIdentityAssociation(ctx, in)
	wantErr[*ekstypes.ResourceInUseException](t, err, "ResourceInUseException")
}

// TestListPodIdentityAssociations: filters by namespace and ServiceAccount, and maxResults pages
// joined by nextToken, through the SDK's paginator.
func TestListPodIdentityAssociations(t *testing.T) {
	_, c := newEKS(t, iamemulator.Options{Seed: 10}, 1)
	ctx := ctx(t)
	for i := range 5 {
		must(c.CreatePodIdentityAssociation(ctx, createInput("team-a", fmt.Sprintf("sa-%d", i), roleA))).ok(t)
	}
	must(c.CreatePodIdentityAssociation(ctx, createInput("team-b", "sa-0", roleA))).ok(t)

	list := func(in *eks.ListPodIdentityAssociationsInput) (names []string, pages int) {
		in.ClusterName = aws.String(eksCluster)
		p := eks.NewListPodIdentityAssociationsPaginator(c, in)
		for p.HasMorePages() {
			page := must(p.NextPage(ctx)).ok(t)
			pages++
			for _, a := range page.Associations {
				names = append(names, aws.ToString(a.Namespace)+"/"+aws.ToString(a.ServiceAccount))
			}
		}
		return names, pages
	}
	all, pages := list(&eks.ListPodIdentityAssociationsInput{MaxResults: aws.Int32(2)})
	if want := []string{"team-a/sa-0", "team-a/sa-1", "team-a/sa-2", "team-a/sa-3", "team-a/sa-4", "team-b/sa-0"}; !slices.Equal(all, want) || pages != 3 {
		t.Errorf("listed %v in %d pages, want %v in 3", all, pages, want)
	}
	if got, _ := list(&eks.ListPodIdentityAssociationsInput{Namespace: aws.String("team-b")}); !slices.Equal(got, []string{"team-b/sa-0"}) {
		t.Errorf("namespace filter: %v", got)
	}
	if got, _ := list(&eks.ListPodIdentityAssociationsInput{ServiceAccount: aws.String("sa-0")}); !slices.Equal(got, []string{"team-a/sa-0", "team-b/sa-0"}) {
		t.Errorf("serviceAccount filter: %v", got)
	}
	if got, _ := list(&eks.ListPodIdentityAssociationsInput{Namespace: aws.String("team-a"), ServiceAccount: aws.String("sa-3")}); !slices.Equal(got, []string{"team-a/sa-3"}) {
		t.Errorf("both filters: %v", got)
	}
	if got, _ := list(&eks.ListPodIdentityAssociationsInput{Namespace: aws.String("team-c")}); len(got) != 0 {
		t.Errorf("no match: %v", got)
	}
}

// TestPodIdentityFaults: injected throttling (429 ThrottlingException) and 503s are classified as
// retryable by the SDK's standard retryer, counted, and change nothing.
func TestPodIdentityFaults(t *testing.T) {
	for _, tc := range []struct {
		kind   iamemulator.FaultKind
		code   string
		status int
	}{
		{iamemulator.FaultThrottle, "ThrottlingException", http.StatusTooManyRequests},
		{iamemulator.Fault5xx, "ServiceUnavailableException", http.StatusServiceUnavailable},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			e, c := newEKS(t, iamemulator.Options{FailRate: 1, FailKinds: []iamemulator.FaultKind{tc.kind}}, 3)
			_, err := c.CreatePodIdentityAssociation(ctx(t), createInput("team-a", "app", roleA))
			var re *awshttp.ResponseError
			var apiErr smithy.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode() != tc.code || !errors.As(err, &re) || re.HTTPStatusCode() != tc.status {
				t.Fatalf("want %s (HTTP %d), got %v", tc.code, tc.status, err)
			}
			st := e.emu.State()
			if st.Calls["CreatePodIdentityAssociation"] != 3 || st.Faults["CreatePodIdentityAssociation"] != 3 || len(st.Associations) != 0 {
				t.Errorf("calls %v faults %v associations %v: want 3 attempts, all faulted, nothing created", st.Calls, st.Faults, st.Associations)
			}
		})
	}
}
