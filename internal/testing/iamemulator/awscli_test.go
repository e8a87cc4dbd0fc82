package iamemulator_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

// awsCLI runs the real AWS CLI (botocore's own serializers and parsers, not the Go SDK's) against
// an emulator. The CLI is $QM_AWS_CLI, or aws on the PATH (pip install awscli).
type awsCLI struct {
	bin, endpoint string
	env           []string
}

func newAWSCLI(t *testing.T, emu *iamemulator.Server) *awsCLI {
	t.Helper()
	bin := os.Getenv("QM_AWS_CLI")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("aws"); err != nil {
			t.Fatal("the AWS CLI is needed to check the emulator's wire protocol: install it (pip install awscli) or set QM_AWS_CLI")
		}
	}
	ts := httptest.NewServer(emu)
	t.Cleanup(ts.Close)
	env := []string{"AWS_ACCESS_KEY_ID=" + iamemulator.AccessKeyID, "AWS_SECRET_ACCESS_KEY=" + iamemulator.SecretAccessKey, "AWS_DEFAULT_REGION=" + iamemulator.Region,
		"AWS_CONFIG_FILE=" + os.DevNull, "AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull, "AWS_EC2_METADATA_DISABLED=true", "AWS_PAGER=",
		// Two attempts in the standard retry mode: the fault test sees the retry without long backoffs.
		"AWS_RETRY_MODE=standard", "AWS_MAX_ATTEMPTS=2"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	return &awsCLI{bin: bin, endpoint: ts.URL, env: env}
}

// run runs one CLI command and returns its output and error output.
func (c *awsCLI) run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append(append([]string{}, args...), "--endpoint-url", c.endpoint, "--output", "json")...)
	cmd.Env = c.env
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// ok runs a command that must succeed and decodes its JSON output into v (when not nil).
func (c *awsCLI) ok(t *testing.T, v any, args ...string) {
	t.Helper()
	out, errOut, err := c.run(t, args...)
	if err != nil {
		t.Fatalf("aws %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	if v != nil {
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatalf("aws %s: output is not JSON: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// fails runs a command that must fail with the AWS error code.
func (c *awsCLI) fails(t *testing.T, code string, args ...string) {
	t.Helper()
	_, errOut, err := c.run(t, args...)
	if err == nil || !strings.Contains(errOut, "("+code+")") {
		t.Errorf("aws %s: want error %s, got %v\n%s", strings.Join(args, " "), code, err, errOut)
	}
}

// TestAWSCLIAgainstTheEmulator checks both protocols the emulator speaks with the real AWS CLI:
// IAM's Query protocol (roles) and EKS's REST-JSON (Pod Identity associations: every operation,
// the list filters and pagination, and the errors).
func TestAWSCLIAgainstTheEmulator(t *testing.T) {
	emu := iamemulator.New(iamemulator.Options{Seed: 11, EKSClusters: []string{"prod"}})
	cli := newAWSCLI(t, emu)

	t.Run("iam", func(t *testing.T) {
		var role struct {
			Role struct{ Arn, RoleName, Path string }
		}
		cli.ok(t, &role, "iam", "create-role", "--role-name", "app", "--path", "/quartermaster/prod/",
			"--assume-role-policy-document", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"pods.eks.amazonaws.com"},"Action":["sts:AssumeRole","sts:TagSession"]}]}`)
		if role.Role.Arn != "arn:aws:iam::000000000000:role/quartermaster/prod/app" {
			t.Errorf("create-role: %+v", role)
		}
		var got struct {
			Role struct {
				RoleName                 string
				AssumeRolePolicyDocument map[string]any
			}
		}
		cli.ok(t, &got, "iam", "get-role", "--role-name", "app")
		if got.Role.RoleName != "app" || got.Role.AssumeRolePolicyDocument["Version"] != "2012-10-17" {
			t.Errorf("get-role (the CLI decodes the percent-encoded document): %+v", got)
		}
		cli.fails(t, "NoSuchEntity", "iam", "get-role", "--role-name", "nope")

		// Inline policies.
		cli.ok(t, nil, "iam", "put-role-policy", "--role-name", "app", "--policy-name", "read",
			"--policy-document", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/a b"}]}`)
		var inline struct {
			RoleName, PolicyName string
			PolicyDocument       struct{ Statement []struct{ Resource string } }
		}
		cli.ok(t, &inline, "iam", "get-role-policy", "--role-name", "app", "--policy-name", "read")
		if inline.PolicyName != "read" || len(inline.PolicyDocument.Statement) != 1 || inline.PolicyDocument.Statement[0].Resource != "arn:aws:s3:::b/a b" {
			t.Errorf("get-role-policy (the CLI decodes the percent-encoded document): %+v", inline)
		}
		var list struct{ PolicyNames []string }
		cli.ok(t, &list, "iam", "list-role-policies", "--role-name", "app")
		if len(list.PolicyNames) != 1 || list.PolicyNames[0] != "read" {
			t.Errorf("list-role-policies: %+v", list)
		}
		cli.fails(t, "MalformedPolicyDocument", "iam", "put-role-policy", "--role-name", "app", "--policy-name", "bad", "--policy-document", `{"Statement":[]}`)
		cli.fails(t, "DeleteConflict", "iam", "delete-role", "--role-name", "app")

		// Access advisor (last accessed information).
		var job struct{ JobId string }
		cli.ok(t, &job, "iam", "generate-service-last-accessed-details", "--arn", role.Role.Arn, "--granularity", "ACTION_LEVEL")
		var report struct {
			JobStatus, JobType   string
			ServicesLastAccessed []struct {
				ServiceNamespace           string
				TrackedActionsLastAccessed []struct{ ActionName string }
			}
		}
		for range 2 {
			cli.ok(t, &report, "iam", "get-service-last-accessed-details", "--job-id", job.JobId)
		}
		if report.JobStatus != "COMPLETED" || report.JobType != "ACTION_LEVEL" || len(report.ServicesLastAccessed) != 1 ||
			report.ServicesLastAccessed[0].ServiceNamespace != "s3" || len(report.ServicesLastAccessed[0].TrackedActionsLastAccessed) != 1 {
			t.Errorf("get-service-last-accessed-details: %+v", report)
		}
		var granting struct {
			PoliciesGrantingServiceAccess []struct {
				ServiceNamespace string
				Policies         []struct{ PolicyName, PolicyType, EntityName string }
			}
		}
		cli.ok(t, &granting, "iam", "list-policies-granting-service-access", "--arn", role.Role.Arn, "--service-namespaces", "s3")
		if g := granting.PoliciesGrantingServiceAccess; len(g) != 1 || len(g[0].Policies) != 1 || g[0].Policies[0].PolicyName != "read" || g[0].Policies[0].PolicyType != "INLINE" {
			t.Errorf("list-policies-granting-service-access: %+v", granting)
		}

		cli.ok(t, nil, "iam", "delete-role-policy", "--role-name", "app", "--policy-name", "read")
		cli.fails(t, "NoSuchEntity", "iam", "get-role-policy", "--role-name", "app", "--policy-name", "read")

		// What shared roles use: statements with IDs and session-tag conditions, the trust
		// policy quota, and taking the owner's tags off.
		shared := `{"Version":"2012-10-17","Statement":[` +
			`{"Sid":"QuartermasterPodIdentity0123456789abcdef","Effect":"Allow","Principal":{"Service":"pods.eks.amazonaws.com"},"Action":["sts:AssumeRole","sts:TagSession"],` +
			`"Condition":{"StringEquals":{"aws:RequestTag/eks-cluster-name":"prod","aws:RequestTag/kubernetes-namespace":"team","aws:RequestTag/kubernetes-service-account":"app"}}},` +
			`{"Sid":"BreakGlass","Effect":"Allow","Principal":{"AWS":"arn:aws:iam::000000000000:root"},"Action":"sts:AssumeRole"}]}`
		cli.ok(t, nil, "iam", "update-assume-role-policy", "--role-name", "app", "--policy-document", shared)
		var trust struct {
			Role struct {
				AssumeRolePolicyDocument struct{ Statement []struct{ Sid string } }
			}
		}
		cli.ok(t, &trust, "iam", "get-role", "--role-name", "app")
		if st := trust.Role.AssumeRolePolicyDocument.Statement; len(st) != 2 || st[0].Sid != "QuartermasterPodIdentity0123456789abcdef" || st[1].Sid != "BreakGlass" {
			t.Errorf("get-role after update-assume-role-policy: %+v", trust)
		}
		big := strings.Replace(shared, `"BreakGlass"`, `"BreakGlass","NotResource":"`+strings.Repeat("x", 2048)+`"`, 1)
		cli.fails(t, "LimitExceeded", "iam", "update-assume-role-policy", "--role-name", "app", "--policy-document", big)
		cli.ok(t, nil, "iam", "tag-role", "--role-name", "app", "--tags", "Key=quartermaster.dev/cluster,Value=prod", "Key=quartermaster.dev/shared-role,Value=app")
		cli.ok(t, nil, "iam", "untag-role", "--role-name", "app", "--tag-keys", "quartermaster.dev/cluster")
		var tags struct{ Tags []struct{ Key, Value string } }
		cli.ok(t, &tags, "iam", "list-role-tags", "--role-name", "app")
		if len(tags.Tags) != 1 || tags.Tags[0].Key != "quartermaster.dev/shared-role" {
			t.Errorf("list-role-tags after untag-role: %+v", tags)
		}
	})

	type assoc struct {
		Association struct {
			AssociationID  string `json:"associationId"`
			AssociationArn string `json:"associationArn"`
			RoleArn        string `json:"roleArn"`
			Namespace      string `json:"namespace"`
			ServiceAccount string `json:"serviceAccount"`
			Tags           map[string]string
		} `json:"association"`
	}
	const roleARN = "arn:aws:iam::000000000000:role/quartermaster/prod/app"
	eks := func(op string, args ...string) []string {
		return append([]string{"eks", op, "--cluster-name", "prod"}, args...)
	}

	t.Run("eks target role", func(t *testing.T) {
		var created struct {
			Association struct {
				AssociationID      string `json:"associationId"`
				TargetRoleArn      string `json:"targetRoleArn"`
				ExternalID         string `json:"externalId"`
				DisableSessionTags bool   `json:"disableSessionTags"`
			} `json:"association"`
		}
		cli.ok(t, &created, eks("create-pod-identity-association", "--namespace", "team-x", "--service-account", "cross",
			"--role-arn", roleARN, "--target-role-arn", "arn:aws:iam::111122223333:role/reader", "--disable-session-tags")...)
		a := created.Association
		if a.TargetRoleArn != "arn:aws:iam::111122223333:role/reader" || len(a.ExternalID) != 36 || !a.DisableSessionTags {
			t.Fatalf("create with a target: %+v", a)
		}
		var updated = created
		cli.ok(t, &updated, eks("update-pod-identity-association", "--association-id", a.AssociationID, "--no-disable-session-tags")...)
		if u := updated.Association; u.ExternalID != a.ExternalID || u.DisableSessionTags {
			t.Errorf("update of the session tags alone keeps the external ID: %+v", u)
		}
		cli.ok(t, &updated, eks("update-pod-identity-association", "--association-id", a.AssociationID, "--target-role-arn", "arn:aws:iam::111122223333:role/writer")...)
		if u := updated.Association; u.ExternalID == a.ExternalID || u.TargetRoleArn != "arn:aws:iam::111122223333:role/writer" {
			t.Errorf("a new target gets a new external ID: %+v", u)
		}
		cli.fails(t, "InvalidParameterException", eks("update-pod-identity-association", "--association-id", a.AssociationID, "--target-role-arn", "arn:aws:iam::111122223333:user/bob")...)
		cli.ok(t, nil, eks("delete-pod-identity-association", "--association-id", a.AssociationID)...)
	})

	t.Run("eks", func(t *testing.T) {
		var created assoc
		cli.ok(t, &created, eks("create-pod-identity-association", "--namespace", "team-a", "--service-account", "app",
			"--role-arn", roleARN, "--tags", "quartermaster.dev/cluster=prod")...)
		id := created.Association.AssociationID
		if !strings.HasPrefix(id, "a-") || created.Association.RoleArn != roleARN || created.Association.Tags["quartermaster.dev/cluster"] != "prod" {
			t.Fatalf("create: %+v", created)
		}
		var described assoc
		cli.ok(t, &described, eks("describe-pod-identity-association", "--association-id", id)...)
		if described.Association.Namespace != "team-a" || described.Association.ServiceAccount != "app" {
			t.Errorf("describe: %+v", described)
		}
		var updated assoc
		cli.ok(t, &updated, eks("update-pod-identity-association", "--association-id", id, "--role-arn", roleARN+"-2")...)
		if updated.Association.RoleArn != roleARN+"-2" {
			t.Errorf("update: %+v", updated)
		}
		// The ARN's slashes travel percent-encoded in the path.
		cli.ok(t, nil, "eks", "tag-resource", "--resource-arn", created.Association.AssociationArn, "--tags", "team=a")
		var tags struct{ Tags map[string]string }
		cli.ok(t, &tags, "eks", "list-tags-for-resource", "--resource-arn", created.Association.AssociationArn)
		if tags.Tags["team"] != "a" || tags.Tags["quartermaster.dev/cluster"] != "prod" {
			t.Errorf("tags: %v", tags.Tags)
		}

		for _, sa := range []string{"b", "c", "d", "e"} {
			cli.ok(t, nil, eks("create-pod-identity-association", "--namespace", "team-b", "--service-account", sa, "--role-arn", roleARN)...)
		}
		var list struct {
			Associations []struct {
				Namespace      string `json:"namespace"`
				ServiceAccount string `json:"serviceAccount"`
			} `json:"associations"`
		}
		// --page-size 2: the CLI follows nextToken itself, over three pages.
		cli.ok(t, &list, eks("list-pod-identity-associations", "--page-size", "2")...)
		if len(list.Associations) != 5 || emu.Calls("ListPodIdentityAssociations") != 3 {
			t.Errorf("list over pages of 2: %d associations in %d calls, want 5 in 3", len(list.Associations), emu.Calls("ListPodIdentityAssociations"))
		}
		cli.ok(t, &list, eks("list-pod-identity-associations", "--namespace", "team-b", "--service-account", "d")...)
		if len(list.Associations) != 1 || list.Associations[0].ServiceAccount != "d" {
			t.Errorf("filtered list: %+v", list.Associations)
		}

		cli.fails(t, "ResourceInUseException", eks("create-pod-identity-association", "--namespace", "team-a", "--service-account", "app", "--role-arn", roleARN)...)
		cli.fails(t, "InvalidParameterException", eks("create-pod-identity-association", "--namespace", "team-a", "--service-account", "x", "--role-arn", "not-an-arn")...)
		cli.fails(t, "ResourceNotFoundException", "eks", "create-pod-identity-association", "--cluster-name", "staging", "--namespace", "team-a", "--service-account", "x", "--role-arn", roleARN)
		cli.fails(t, "ResourceNotFoundException", eks("describe-pod-identity-association", "--association-id", "a-00000000000000000")...)

		cli.ok(t, nil, eks("delete-pod-identity-association", "--association-id", id)...)
		cli.fails(t, "ResourceNotFoundException", eks("delete-pod-identity-association", "--association-id", id)...)
		if n := len(emu.State().Associations); n != 4 {
			t.Errorf("%d associations left, want 4", n)
		}
	})

	t.Run("eks faults are retried by the CLI", func(t *testing.T) {
		emu.SetFaults(1, []iamemulator.FaultKind{iamemulator.FaultThrottle})
		defer emu.SetFaults(0, nil)
		before := emu.Calls("ListPodIdentityAssociations")
		cli.fails(t, "ThrottlingException", eks("list-pod-identity-associations")...)
		if n := emu.Calls("ListPodIdentityAssociations") - before; n != 2 {
			t.Errorf("the CLI tried %d times, want 2 (AWS_MAX_ATTEMPTS): ThrottlingException must be retryable", n)
		}
	})
}
