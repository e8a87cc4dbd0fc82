package iam

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testAccessReport: with --iam-unused-after, an IAMServiceAccount's status lists what its role is
// granted and has not used (a whole service, or the unused actions of a used service IAM tracks by
// action), each with the policies granting it, from IAM's last-accessed job (started, polled,
// read); an Event says what changed and the metric counts it; a job that fails leaves the report
// Unknown with IAM's reason; without the flag there is no report and no such call.
func testAccessReport(t *testing.T, f *fixture) {
	ctx := context.Background()
	const ns = "t-access"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "app")
	f.policy(t, ns, "data", "s3:GetObject", "s3:PutObject", "sqs:SendMessage")
	opts := f.opts
	opts.UnusedAfter = 90 * 24 * time.Hour
	opts.Resync = time.Hour
	f.run(t, opts)
	defer f.run(t, f.opts)
	f.emu.SetJobPolls(2)
	defer f.emu.SetJobPolls(0)

	// The role's callers (IAM records by ARN): S3 reads recently, S3 writes long ago, SQS and logs never.
	roleARN := "arn:aws:iam::" + f.emu.AccountID() + ":role" + irsa.Path(testCluster) + irsa.RoleName(ns, "app")
	f.emu.RecordAccess(roleARN, "s3:GetObject", time.Now().Add(-24*time.Hour))
	f.emu.RecordAccess(roleARN, "s3:PutObject", time.Now().Add(-200*24*time.Hour))
	// The role is created "200 days ago": a younger one is not reported (below).
	f.emu.SetNow(func() time.Time { return time.Now().Add(-200 * 24 * time.Hour) })
	sa := f.iamsa(t, ns, "app", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "app", Policies: []string{"data"},
		InlinePolicies: []iamv1alpha1.InlinePolicy{{Name: "logs", Document: document("logs:PutLogEvents")}}})
	sa = waitReady(t, f, sa)
	f.emu.SetNow(nil)
	if sa.Status.RoleARN != roleARN {
		t.Fatalf("role %s, want %s", sa.Status.RoleARN, roleARN)
	}
	var rep *iamv1alpha1.AccessReport
	testenv.Eventually(t, "the access report", func() (bool, string) {
		must(t, f.c.Get(ctx, request(sa).NamespacedName, sa))
		rep = sa.Status.AccessReport
		if rep == nil {
			return false, "no report"
		}
		return rep.State == iamv1alpha1.AccessReportCurrent && len(rep.Unused) == 3, fmt.Sprintf("%+v", rep)
	})
	got := map[string]iamv1alpha1.UnusedGrant{}
	for _, u := range rep.Unused {
		got[u.Service] = u
	}
	if u := got["s3"]; fmt.Sprint(u.Actions) != "[s3:PutObject]" || fmt.Sprint(u.GrantedBy) != "[IAMPolicy data]" {
		t.Errorf("s3: %+v", u)
	}
	if u := got["sqs"]; len(u.Actions) != 0 || fmt.Sprint(u.GrantedBy) != "[IAMPolicy data]" {
		t.Errorf("sqs: %+v", u)
	}
	if u := got["logs"]; len(u.Actions) != 0 || fmt.Sprint(u.GrantedBy) != "[inline policy logs]" {
		t.Errorf("logs: %+v", u)
	}
	if !strings.Contains(rep.Message, "granted but not used within 2160h0m0s") || rep.JobID != "" || rep.CheckedAt == nil {
		t.Errorf("report %+v", rep)
	}
	e := testenv.WaitForEvent(t, f.c, sa, "UnusedPermissions")
	if !strings.Contains(e.Note, "s3:PutObject") {
		t.Errorf("UnusedPermissions Event %q", e.Note)
	}
	elected := make(chan struct{})
	close(elected)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(&unusedCollector{reader: f.c, elected: elected})
	families, err := reg.Gather()
	must(t, err)
	found := false
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if mf.GetName() == "quartermaster_iam_unused_grants" && labels["namespace"] == ns && labels["name"] == "app" {
				found = m.GetGauge().GetValue() == 3
			}
		}
	}
	if !found {
		t.Errorf("quartermaster_iam_unused_grants{namespace=%q,name=\"app\"} is not 3: %v", ns, families)
	}

	// A job IAM fails: Unknown, with IAM's reason; the list is kept for what it was.
	f.emu.FailJobs(1)
	r, _ := f.standaloneServiceAccount(t)
	r.cfg.unusedAfter, r.accessPoll = opts.UnusedAfter, 100*time.Millisecond
	must(t, f.c.Get(ctx, request(sa).NamespacedName, sa))
	sa.Status.AccessReport.CheckedAt = nil // due now
	old := time.Now().Add(-200 * 24 * time.Hour)
	if poll := r.reportAccess(ctx, sa, old); poll == 0 {
		t.Fatal("no job started")
	}
	for range 5 {
		if r.reportAccess(ctx, sa, old) == 0 {
			break
		}
	}
	if rep := sa.Status.AccessReport; rep.State != iamv1alpha1.AccessReportUnknown || !strings.Contains(rep.Message, "failed: The job could not be completed.") {
		t.Errorf("after a failed job: %+v", rep)
	}

	// A role younger than the period: nothing is reported unused yet, and the report says until when.
	sa.Status.AccessReport.CheckedAt = nil
	young := time.Now().Add(-24 * time.Hour)
	for range 5 {
		if r.reportAccess(ctx, sa, young) == 0 {
			break
		}
	}
	if rep := sa.Status.AccessReport; rep.State != iamv1alpha1.AccessReportCurrent || len(rep.Unused) != 0 || !strings.Contains(rep.Message, "nothing is reported unused before") {
		t.Errorf("a young role's report: %+v", rep)
	}
}
