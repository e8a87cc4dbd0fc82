package awsiam_test

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

func TestAccountID(t *testing.T) {
	c, emu, _ := newClient(t, iamemulator.Options{AccountID: "123456789012"})
	if got := must(c.AccountID(testCtx(t))).ok(t); got != "123456789012" {
		t.Errorf("AccountID = %q, want 123456789012", got)
	}
	if n := emu.Calls("GetCallerIdentity"); n != 1 {
		t.Errorf("GetCallerIdentity calls = %d, want 1", n)
	}
}

func TestPolicyLifecycle(t *testing.T) {
	c, emu, _ := newClient(t, iamemulator.Options{AccountID: "123456789012"})
	ctx := testCtx(t)
	const arn = "arn:aws:iam::123456789012:policy/quartermaster/app-read"

	created := must(c.CreatePolicy(ctx, awsiam.NewPolicy{
		Name: "app-read", Path: "/quartermaster/", Description: "read the bucket", Document: policyDoc,
		Tags: awsiam.Tags{"owner": "team-a", "managed-by": "quartermaster"},
	})).ok(t)
	want := awsiam.Policy{
		ARN: arn, ID: created.ID, Name: "app-read", Path: "/quartermaster/", Description: "read the bucket",
		DefaultVersionID: "v1", Tags: awsiam.Tags{"owner": "team-a", "managed-by": "quartermaster"},
	}
	if created.ID == "" || !policyEqual(*created, want) {
		t.Errorf("CreatePolicy = %+v, want %+v", *created, want)
	}
	if got := must(c.GetPolicy(ctx, arn)).ok(t); !policyEqual(*got, want) {
		t.Errorf("GetPolicy = %+v, want %+v", *got, want)
	}
	// IAM answers documents percent-encoded; the adapter gives back the JSON that was sent.
	if got := must(c.GetPolicyDocument(ctx, arn, "v1")).ok(t); got != policyDoc {
		t.Errorf("GetPolicyDocument(v1) = %q, want %q", got, policyDoc)
	}

	_, err := c.CreatePolicy(ctx, awsiam.NewPolicy{Name: "APP-READ", Document: policyDoc})
	if !awsiam.IsAlreadyExists(err) {
		t.Errorf("CreatePolicy with a taken name: %v, want EntityAlreadyExists", err)
	}

	for i := 2; i <= 5; i++ {
		if id := must(c.CreatePolicyVersion(ctx, arn, docVersion(strconv.Itoa(i)))).ok(t); id != "v"+strconv.Itoa(i) {
			t.Errorf("CreatePolicyVersion #%d = %q", i, id)
		}
	}
	versions := must(c.ListPolicyVersions(ctx, arn)).ok(t)
	var ids []string
	for _, v := range versions {
		ids = append(ids, v.ID)
		if v.IsDefault != (v.ID == "v5") || v.Created.IsZero() {
			t.Errorf("version %+v: want only v5 default and a creation time", v)
		}
	}
	if !slices.Equal(ids, []string{"v1", "v2", "v3", "v4", "v5"}) {
		t.Errorf("ListPolicyVersions = %v, want oldest first", ids)
	}
	if p := must(c.GetPolicy(ctx, arn)).ok(t); p.DefaultVersionID != "v5" {
		t.Errorf("DefaultVersionID = %q, want v5 (SetAsDefault)", p.DefaultVersionID)
	}
	if got := must(c.GetPolicyDocument(ctx, arn, "v5")).ok(t); got != docVersion("5") {
		t.Errorf("GetPolicyDocument(v5) = %q", got)
	}
	_, err = c.CreatePolicyVersion(ctx, arn, docVersion("6"))
	if awsiam.ErrorCode(err) != "LimitExceeded" {
		t.Errorf("a sixth version: %v, want LimitExceeded", err)
	}
	if err := c.DeletePolicyVersion(ctx, arn, "v5"); !awsiam.IsConflict(err) {
		t.Errorf("deleting the default version: %v, want DeleteConflict", err)
	}
	if err := c.DeletePolicy(ctx, arn); !awsiam.IsConflict(err) {
		t.Errorf("deleting a policy with versions: %v, want DeleteConflict", err)
	}

	noErr(t, c.TagPolicy(ctx, arn, awsiam.Tags{"owner": "team-b", "env": "prod"}))
	before := emu.Calls("TagPolicy")
	noErr(t, c.TagPolicy(ctx, arn, nil))
	if emu.Calls("TagPolicy") != before {
		t.Error("TagPolicy with no tags called IAM")
	}
	if got := must(c.GetPolicy(ctx, arn)).ok(t).Tags; !maps.Equal(got, awsiam.Tags{"owner": "team-b", "env": "prod", "managed-by": "quartermaster"}) {
		t.Errorf("tags after TagPolicy = %v", got)
	}

	for _, v := range []string{"v1", "v2", "v3", "v4"} {
		noErr(t, c.DeletePolicyVersion(ctx, arn, v))
	}
	if err := c.DeletePolicyVersion(ctx, arn, "v1"); !awsiam.IsNotFound(err) {
		t.Errorf("deleting a deleted version: %v, want NoSuchEntity", err)
	}
	noErr(t, c.DeletePolicy(ctx, arn))
	for name, err := range map[string]error{
		"GetPolicy":          second(c.GetPolicy(ctx, arn)),
		"GetPolicyDocument":  second(c.GetPolicyDocument(ctx, arn, "v5")),
		"ListPolicyVersions": second(c.ListPolicyVersions(ctx, arn)),
		"DeletePolicy":       c.DeletePolicy(ctx, arn),
		"TagPolicy":          c.TagPolicy(ctx, arn, awsiam.Tags{"a": "b"}),
	} {
		if !awsiam.IsNotFound(err) {
			t.Errorf("%s of a deleted policy: %v, want NoSuchEntity", name, err)
		}
	}
}

func TestRoleLifecycle(t *testing.T) {
	c, _, _ := newClient(t, iamemulator.Options{})
	ctx := testCtx(t)
	boundary := must(c.CreatePolicy(ctx, awsiam.NewPolicy{Name: "boundary", Document: policyDoc})).ok(t)
	local := must(c.CreatePolicy(ctx, awsiam.NewPolicy{Name: "local", Document: policyDoc})).ok(t)
	const readOnly = "arn:aws:iam::aws:policy/ReadOnlyAccess"

	created := must(c.CreateRole(ctx, awsiam.NewRole{
		Name: "eks-sa-app", Path: "/quartermaster/", Description: "app role", TrustPolicy: trustDoc,
		MaxSessionDuration: 7200, PermissionsBoundaryARN: boundary.ARN, Tags: awsiam.Tags{"managed-by": "quartermaster"},
	})).ok(t)
	want := awsiam.Role{
		Name: "eks-sa-app", ID: created.ID, ARN: "arn:aws:iam::000000000000:role/quartermaster/eks-sa-app", Path: "/quartermaster/",
		Description: "app role", TrustPolicy: trustDoc, MaxSessionDuration: 7200, PermissionsBoundaryARN: boundary.ARN,
		Tags: awsiam.Tags{"managed-by": "quartermaster"},
	}
	if created.ID == "" || !roleEqual(*created, want) {
		t.Errorf("CreateRole = %+v, want %+v", *created, want)
	}
	if got := must(c.GetRole(ctx, "eks-sa-app")).ok(t); !roleEqual(*got, want) {
		t.Errorf("GetRole = %+v, want %+v", *got, want)
	}
	// Role names are case-insensitive in IAM.
	if _, err := c.CreateRole(ctx, awsiam.NewRole{Name: "EKS-SA-APP", TrustPolicy: trustDoc}); !awsiam.IsAlreadyExists(err) {
		t.Errorf("CreateRole with a taken name: %v, want EntityAlreadyExists", err)
	}
	// Zero values take IAM's defaults.
	plain := must(c.CreateRole(ctx, awsiam.NewRole{Name: "plain", TrustPolicy: trustDoc})).ok(t)
	if plain.Path != "/" || plain.MaxSessionDuration != awsiam.DefaultMaxSessionDuration || plain.PermissionsBoundaryARN != "" || plain.Tags != nil || plain.Description != "" {
		t.Errorf("role with defaults = %+v", *plain)
	}

	newTrust := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"pods.eks.amazonaws.com"},"Action":["sts:AssumeRole","sts:TagSession"]}]}`
	noErr(t, c.UpdateTrustPolicy(ctx, "eks-sa-app", newTrust))
	noErr(t, c.UpdateRole(ctx, "eks-sa-app", "new description", 43200))
	noErr(t, c.DeletePermissionsBoundary(ctx, "eks-sa-app"))
	noErr(t, c.TagRole(ctx, "eks-sa-app", awsiam.Tags{"team": "a", "managed-by": "qm"}))
	got := must(c.GetRole(ctx, "eks-sa-app")).ok(t)
	if got.TrustPolicy != newTrust || got.Description != "new description" || got.MaxSessionDuration != 43200 || got.PermissionsBoundaryARN != "" ||
		!maps.Equal(got.Tags, awsiam.Tags{"team": "a", "managed-by": "qm"}) {
		t.Errorf("after updates: %+v", *got)
	}
	noErr(t, c.UpdateRole(ctx, "eks-sa-app", "", 0))
	noErr(t, c.PutPermissionsBoundary(ctx, "eks-sa-app", local.ARN))
	got = must(c.GetRole(ctx, "eks-sa-app")).ok(t)
	if got.Description != "" || got.MaxSessionDuration != awsiam.DefaultMaxSessionDuration || got.PermissionsBoundaryARN != local.ARN {
		t.Errorf("UpdateRole(\"\", 0) and PutPermissionsBoundary: %+v", *got)
	}

	noErr(t, c.AttachPolicy(ctx, "eks-sa-app", local.ARN))
	noErr(t, c.AttachPolicy(ctx, "eks-sa-app", readOnly))
	noErr(t, c.AttachPolicy(ctx, "eks-sa-app", local.ARN)) // attaching twice is a no-op
	if got := must(c.ListAttachedPolicies(ctx, "eks-sa-app")).ok(t); !slices.Equal(got, []string{local.ARN, readOnly}) {
		t.Errorf("ListAttachedPolicies = %v", got)
	}
	if n := must(c.GetPolicy(ctx, local.ARN)).ok(t).AttachmentCount; n != 1 {
		t.Errorf("AttachmentCount = %d, want 1", n)
	}
	if err := c.DeleteRole(ctx, "eks-sa-app"); !awsiam.IsConflict(err) {
		t.Errorf("DeleteRole with attached policies: %v, want DeleteConflict", err)
	}
	if err := c.DeletePolicy(ctx, local.ARN); !awsiam.IsConflict(err) {
		t.Errorf("DeletePolicy of an attached policy: %v, want DeleteConflict", err)
	}
	noErr(t, c.DetachPolicy(ctx, "eks-sa-app", local.ARN))
	if err := c.DetachPolicy(ctx, "eks-sa-app", local.ARN); !awsiam.IsNotFound(err) {
		t.Errorf("detaching a detached policy: %v, want NoSuchEntity", err)
	}
	noErr(t, c.DetachPolicy(ctx, "eks-sa-app", readOnly))
	if got := must(c.ListAttachedPolicies(ctx, "eks-sa-app")).ok(t); len(got) != 0 {
		t.Errorf("ListAttachedPolicies after detaching = %v", got)
	}
	// A permissions boundary does not block DeleteRole.
	noErr(t, c.DeleteRole(ctx, "eks-sa-app"))

	for name, err := range map[string]error{
		"GetRole":                          second(c.GetRole(ctx, "eks-sa-app")),
		"UpdateTrustPolicy":                c.UpdateTrustPolicy(ctx, "eks-sa-app", trustDoc),
		"UpdateRole":                       c.UpdateRole(ctx, "eks-sa-app", "", 0),
		"PutPermissionsBoundary":           c.PutPermissionsBoundary(ctx, "eks-sa-app", local.ARN),
		"DeletePermissionsBoundary":        c.DeletePermissionsBoundary(ctx, "eks-sa-app"),
		"ListAttachedPolicies":             second(c.ListAttachedPolicies(ctx, "eks-sa-app")),
		"AttachPolicy":                     c.AttachPolicy(ctx, "eks-sa-app", local.ARN),
		"DeleteRole":                       c.DeleteRole(ctx, "eks-sa-app"),
		"TagRole":                          c.TagRole(ctx, "eks-sa-app", awsiam.Tags{"a": "b"}),
		"UntagRole":                        c.UntagRole(ctx, "eks-sa-app", []string{"a"}),
		"AttachPolicy of a missing policy": c.AttachPolicy(ctx, "plain", "arn:aws:iam::000000000000:policy/missing"),
	} {
		if !awsiam.IsNotFound(err) {
			t.Errorf("%s: %v, want NoSuchEntity", name, err)
		}
	}
}

func TestListRolesForPolicy(t *testing.T) {
	c, emu, _ := newClient(t, iamemulator.Options{})
	ctx := testCtx(t)
	pol := must(c.CreatePolicy(ctx, awsiam.NewPolicy{Name: "shared", Document: policyDoc})).ok(t)
	if got := must(c.ListRolesForPolicy(ctx, pol.ARN)).ok(t); len(got) != 0 {
		t.Errorf("roles of an unattached policy = %v", got)
	}

	// More roles than IAM's default page size (100), so the adapter must follow the marker.
	const n = 105
	var want []string
	for i := range n {
		name := fmt.Sprintf("role-%03d", i)
		must(c.CreateRole(ctx, awsiam.NewRole{Name: name, TrustPolicy: trustDoc})).ok(t)
		noErr(t, c.AttachPolicy(ctx, name, pol.ARN))
		want = append(want, name)
	}
	// A role that only uses the policy as its boundary is not attached to it.
	must(c.CreateRole(ctx, awsiam.NewRole{Name: "bounded-only", TrustPolicy: trustDoc, PermissionsBoundaryARN: pol.ARN})).ok(t)

	before := emu.Calls("ListEntitiesForPolicy")
	got := must(c.ListRolesForPolicy(ctx, pol.ARN)).ok(t)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("ListRolesForPolicy returned %d roles, want %d (%v…)", len(got), n, got[:min(3, len(got))])
	}
	if calls := emu.Calls("ListEntitiesForPolicy") - before; calls != 2 {
		t.Errorf("ListEntitiesForPolicy calls = %d, want 2 pages", calls)
	}
	if p := must(c.GetPolicy(ctx, pol.ARN)).ok(t); p.AttachmentCount != n {
		t.Errorf("AttachmentCount = %d, want %d", p.AttachmentCount, n)
	}

	if _, err := c.ListRolesForPolicy(ctx, "arn:aws:iam::000000000000:policy/missing"); !awsiam.IsNotFound(err) {
		t.Errorf("ListRolesForPolicy of a missing policy: %v, want NoSuchEntity", err)
	}
}

func TestListAttachedPoliciesAtQuota(t *testing.T) {
	c, _, _ := newClient(t, iamemulator.Options{})
	ctx := testCtx(t)
	must(c.CreateRole(ctx, awsiam.NewRole{Name: "full", TrustPolicy: trustDoc})).ok(t)
	var want []string
	for i := range 10 {
		p := must(c.CreatePolicy(ctx, awsiam.NewPolicy{Name: fmt.Sprintf("p-%02d", i), Document: policyDoc})).ok(t)
		noErr(t, c.AttachPolicy(ctx, "full", p.ARN))
		want = append(want, p.ARN)
	}
	if got := must(c.ListAttachedPolicies(ctx, "full")).ok(t); !slices.Equal(got, want) {
		t.Errorf("ListAttachedPolicies = %v, want %v", got, want)
	}
	extra := must(c.CreatePolicy(ctx, awsiam.NewPolicy{Name: "p-10", Document: policyDoc})).ok(t)
	if err := c.AttachPolicy(ctx, "full", extra.ARN); awsiam.ErrorCode(err) != "LimitExceeded" || awsiam.IsThrottleOrServer(err) {
		t.Errorf("an eleventh attachment: %v, want LimitExceeded (not retryable)", err)
	}
}

func second[T any](_ T, err error) error { return err }

func policyEqual(a, b awsiam.Policy) bool {
	return a.ARN == b.ARN && a.ID == b.ID && a.Name == b.Name && a.Path == b.Path && a.Description == b.Description &&
		a.DefaultVersionID == b.DefaultVersionID && a.AttachmentCount == b.AttachmentCount && maps.Equal(a.Tags, b.Tags)
}

func roleEqual(a, b awsiam.Role) bool {
	return a.Name == b.Name && a.ID == b.ID && a.ARN == b.ARN && a.Path == b.Path && a.Description == b.Description &&
		a.TrustPolicy == b.TrustPolicy && a.MaxSessionDuration == b.MaxSessionDuration &&
		a.PermissionsBoundaryARN == b.PermissionsBoundaryARN && maps.Equal(a.Tags, b.Tags)
}
