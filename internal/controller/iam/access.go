package iam

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
)

// accessJobTimeout is how long IAM's last-accessed job may run before the report says unknown.
const accessJobTimeout = 15 * time.Minute

// reportAccess keeps the role's access report (status.accessReport) when --iam-unused-after is
// set: at most once per resync it starts IAM's last-accessed job (asynchronous), polls it at later
// reconciles, and, once IAM answers, lists the granted services and actions not used within the
// period with the policies that grant them (an Event when the list changes). A job that fails,
// vanishes or never completes leaves the report Unknown with the reason, never empty. It returns
// how soon to poll again (0: no job runs).
func (r *ServiceAccountReconciler) reportAccess(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, roleCreated time.Time) time.Duration {
	if r.cfg.unusedAfter <= 0 || sa.Status.RoleARN == "" {
		sa.Status.AccessReport = nil
		return 0
	}
	rep := sa.Status.AccessReport
	if rep == nil {
		rep = &iamv1alpha1.AccessReport{State: iamv1alpha1.AccessReportPending}
		sa.Status.AccessReport = rep
	}
	now := time.Now()
	unknown := func(msg string) time.Duration {
		rep.State, rep.Message, rep.JobID, rep.JobStarted = iamv1alpha1.AccessReportUnknown, msg, "", nil
		rep.CheckedAt = &metav1.Time{Time: now}
		return 0
	}
	if rep.JobID == "" {
		if rep.CheckedAt != nil && now.Sub(rep.CheckedAt.Time) < r.cfg.resync {
			return 0
		}
		id, err := r.aws.StartAccessReport(ctx, sa.Status.RoleARN)
		if err != nil {
			return unknown("starting IAM's last-accessed job: " + awsiam.StatusMessage(err))
		}
		rep.State, rep.JobID, rep.JobStarted = iamv1alpha1.AccessReportPending, id, &metav1.Time{Time: now}
		if rep.Message == "" {
			rep.Message = "IAM's last-accessed job is running"
		}
		return r.accessPoll
	}
	report, err := r.aws.AccessReport(ctx, rep.JobID)
	switch {
	case err != nil:
		return unknown("reading IAM's last-accessed job " + rep.JobID + ": " + awsiam.StatusMessage(err))
	case report.Status == "FAILED":
		return unknown("IAM's last-accessed job " + rep.JobID + " failed: " + report.Error)
	case report.Status != "COMPLETED" && rep.JobStarted != nil && now.Sub(rep.JobStarted.Time) > accessJobTimeout:
		return unknown(fmt.Sprintf("IAM's last-accessed job %s did not complete within %s", rep.JobID, accessJobTimeout))
	case report.Status != "COMPLETED":
		return r.accessPoll
	}
	cutoff := now.Add(-r.cfg.unusedAfter)
	if roleCreated.After(cutoff) {
		// A role younger than the period has not had the time to use what it is granted.
		rep.Unused = nil
		rep.State, rep.JobID, rep.JobStarted = iamv1alpha1.AccessReportCurrent, "", nil
		rep.Message = fmt.Sprintf("the role was created %s: nothing is reported unused before %s", roleCreated.UTC().Format(time.RFC3339), roleCreated.Add(r.cfg.unusedAfter).UTC().Format(time.RFC3339))
		rep.CheckedAt = &metav1.Time{Time: now}
		return 0
	}
	unused := unusedGrants(report.Services, cutoff)
	if len(unused) > 0 {
		var namespaces []string
		for _, u := range unused {
			namespaces = append(namespaces, u.Service)
		}
		granting, err := r.aws.PoliciesGranting(ctx, sa.Status.RoleARN, namespaces)
		if err != nil {
			return unknown("reading which policies grant the unused services: " + awsiam.StatusMessage(err))
		}
		for i := range unused {
			unused[i].GrantedBy = r.grantedBy(sa, granting[unused[i].Service])
		}
	}
	if !equality.Semantic.DeepEqual(unused, rep.Unused) {
		r.recorder.Eventf(sa, nil, corev1.EventTypeNormal, "UnusedPermissions", "Report", "%s", describeUnused(unused, r.cfg.unusedAfter))
	}
	rep.Unused = unused
	rep.State, rep.Message, rep.JobID, rep.JobStarted = iamv1alpha1.AccessReportCurrent, describeUnused(unused, r.cfg.unusedAfter), "", nil
	rep.CheckedAt = &metav1.Time{Time: now}
	return 0
}

// unusedGrants are the services not used since cutoff and, of the services used since, the
// tracked actions not used since: IAM's report read against the period.
func unusedGrants(services []awsiam.ServiceAccess, cutoff time.Time) []iamv1alpha1.UnusedGrant {
	stale := func(t *time.Time) bool { return t == nil || t.Before(cutoff) }
	var out []iamv1alpha1.UnusedGrant
	for _, s := range services {
		if stale(s.LastUsed) {
			out = append(out, iamv1alpha1.UnusedGrant{Service: s.Namespace})
			continue
		}
		var actions []string
		for _, a := range s.Actions {
			if stale(a.LastUsed) {
				actions = append(actions, s.Namespace+":"+a.Name)
			}
		}
		if len(actions) > 0 {
			slices.Sort(actions)
			out = append(out, iamv1alpha1.UnusedGrant{Service: s.Namespace, Actions: actions})
		}
	}
	slices.SortFunc(out, func(a, b iamv1alpha1.UnusedGrant) int { return strings.Compare(a.Service, b.Service) })
	return out
}

// grantedBy names the policies that grant a service as the user knows them: the IAMPolicy of
// spec.policies behind a policy of ours, an inline policy by name, another managed one by ARN.
func (r *ServiceAccountReconciler) grantedBy(sa *iamv1alpha1.IAMServiceAccount, policies []awsiam.GrantingPolicy) []string {
	var out []string
	for _, p := range policies {
		name := p.ARN
		switch p.Type {
		case "INLINE":
			name = "inline policy " + p.Name
		default:
			for _, own := range sa.Spec.Policies {
				if irsa.PolicyName(sa.Namespace, own) == p.Name && strings.Contains(p.ARN, irsa.Path(r.cfg.cluster)) {
					name = "IAMPolicy " + own
				}
			}
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// describeUnused says in a line what the report found.
func describeUnused(unused []iamv1alpha1.UnusedGrant, period time.Duration) string {
	if len(unused) == 0 {
		return fmt.Sprintf("every granted service and tracked action was used within %s", period)
	}
	const shown = 20 // a role granted "*" may have hundreds: status.accessReport.unused lists them all
	var parts []string
	for _, u := range unused[:min(len(unused), shown)] {
		if len(u.Actions) == 0 {
			parts = append(parts, u.Service)
		} else {
			parts = append(parts, strings.Join(u.Actions, ", "))
		}
	}
	more := ""
	if len(unused) > shown {
		more = fmt.Sprintf("; and %d more services", len(unused)-shown)
	}
	return fmt.Sprintf("granted but not used within %s: %s%s", period, strings.Join(parts, "; "), more)
}

// unusedCount is the number of unused grants a report lists (a whole service counts once, else
// each action).
func unusedCount(rep *iamv1alpha1.AccessReport) int {
	n := 0
	for _, u := range rep.Unused {
		n += max(len(u.Actions), 1)
	}
	return n
}

var unusedDesc = prometheus.NewDesc("quartermaster_iam_unused_grants",
	"Granted services and actions an IAMServiceAccount's role has not used within --iam-unused-after (a whole service counts once, else each action), from its last access report; read from the leader's cache at each scrape.",
	[]string{"namespace", "name"}, nil)

// unusedCollector reports quartermaster_iam_unused_grants from the cached IAMServiceAccounts.
type unusedCollector struct {
	reader  client.Reader
	elected <-chan struct{}
}

func registerUnusedMetric(mgr ctrl.Manager) error {
	err := crmetrics.Registry.Register(&unusedCollector{reader: mgr.GetCache(), elected: mgr.Elected()})
	if already := (prometheus.AlreadyRegisteredError{}); errors.As(err, &already) {
		return nil // another manager of this process (tests) registered it
	}
	return err
}

func (c *unusedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- unusedDesc }

func (c *unusedCollector) Collect(ch chan<- prometheus.Metric) {
	select {
	case <-c.elected:
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list := &iamv1alpha1.IAMServiceAccountList{}
	if c.reader.List(ctx, list) != nil {
		return
	}
	for _, sa := range list.Items {
		if rep := sa.Status.AccessReport; rep != nil && rep.State != iamv1alpha1.AccessReportUnknown && rep.CheckedAt != nil {
			ch <- prometheus.MustNewConstMetric(unusedDesc, prometheus.GaugeValue, float64(unusedCount(rep)), sa.Namespace, sa.Name)
		}
	}
}
