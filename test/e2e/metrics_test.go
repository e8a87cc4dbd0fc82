//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestMetricsAnAuthorizedScraperSees runs the manager with namespaces, iam (IAM and EKS emulator)
// and vmgroups (vcsim), has each serve an object (the IAMServiceAccount through Pod Identity, so
// EKS calls are counted too), makes IAM fail for one more, and scrapes /metrics with a token bound
// to quartermaster-metrics-reader: every family docs/metrics.md lists is there.
func TestMetricsAnAuthorizedScraperSees(t *testing.T) {
	parallel(t, iamController, vmgroupsController)
	ctx := context.Background()
	requests := newRequestsNamespace(t)
	emu, _, env, args := outsideSystems(t, "e2e-metrics")
	metricsAddr := freeAddr(t)
	startAs(t, "manager", managerNamespace, "quartermaster-manager", env, append(args, "--controllers=namespaces,iam,vmgroups",
		"--health-probe-bind-address=0", "--requests-namespace="+requests,
		"--metrics-bind-address="+metricsAddr, "--leader-elect", "--leader-election-namespace="+managerNamespace,
		"--leader-election-id=e2e-metrics")...)

	ns := newNamespace(t)
	must(t, admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "scraper"}}))
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-scraper"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "quartermaster-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: ns}},
	}
	must(t, admin.Create(ctx, binding))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), binding) })
	_, token, err := cluster.ServiceAccountKubeconfig(ctx, ns, "scraper", 10*time.Minute)
	must(t, err)

	kubectlApply(t, ns, `apiVersion: iam.quartermaster.dev/v1alpha1
kind: IAMServiceAccount
metadata: {name: app}
spec: {serviceAccountName: app, createServiceAccount: true, managedPolicyArns: ["`+readOnlyARN+`"], mechanism: PodIdentity}
---
apiVersion: compute.quartermaster.dev/v1alpha1
kind: VmGroup
metadata: {name: web}
spec: {cpu: 1, memory: 1, template: ha-template, replicas: 1}
`)
	requestNamespace(t, requests, "e2e-metrics", nil)
	kubectlOK(t, "wait", "-n", ns, "iamsa/app", "vg/web", "--for=condition=Ready", "--timeout=120s")
	waitReady(t, requests, "e2e-metrics")

	// IAM throttles every call: the next IAMServiceAccount's reconcile fails after its retries.
	setFaults := func(rate string) {
		resp, err := http.PostForm(emu.url+iamemulator.FaultsPath, url.Values{"rate": {rate}, "kinds": {"throttle"}})
		must(t, err)
		resp.Body.Close()
	}
	setFaults("1")
	t.Cleanup(func() { setFaults("0") })
	kubectlApply(t, ns, `apiVersion: iam.quartermaster.dev/v1alpha1
kind: IAMServiceAccount
metadata: {name: throttled}
spec: {serviceAccountName: throttled, createServiceAccount: true, managedPolicyArns: ["`+readOnlyARN+`"]}
`)

	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the manager's self-signed serving cert
	var body string
	// Counts are at least what this test made: other tests' objects may still be in the cluster.
	want := []string{
		`quartermaster_objects{kind="IAMServiceAccount",state="ready"} [1-9]\d*`,
		`quartermaster_objects{kind="VmGroup",state="ready"} [1-9]\d*`,
		`quartermaster_objects{kind="NamespaceRequest",state="ready"} [1-9]\d*`,
		`quartermaster_objects{kind="IAMPolicy",state="stalled"} \d+`,
		`quartermaster_reconcile_errors_total{kind="IAMServiceAccount",reason="\w+"} [1-9]\d*`,
		`quartermaster_external_requests_total{operation="CreateRole",result="ok",service="iam"} [1-9]\d*`,
		`quartermaster_external_requests_total{operation="\w+",result="Throttling",service="iam"} [1-9]\d*`,
		`quartermaster_external_requests_total{operation="CreatePodIdentityAssociation",result="ok",service="eks"} [1-9]\d*`,
		`quartermaster_external_requests_total{operation="CloneVM_Task",result="ok",service="vsphere"} [1-9]\d*`,
		`quartermaster_external_request_duration_seconds_bucket{operation="CreateRole",service="iam",le="0.1"} [1-9]\d*`,
		`quartermaster_external_request_duration_seconds_count{operation="CloneVM_Task",service="vsphere"} [1-9]\d*`,
		`quartermaster_namespace_requests_served_total [1-9]\d*`,
		`quartermaster_namespace_tokens_rotated_total \d+`,
		`leader_election_master_status{name="e2e-metrics"} 1`,
		`controller_runtime_reconcile_total{controller="iamserviceaccount",result="requeue_after"} [1-9]\d*`,
	}
	missing := func() []string {
		req, _ := http.NewRequest(http.MethodGet, "https://"+metricsAddr+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := insecure.Do(req)
		if err != nil {
			return []string{err.Error()}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		var out []string
		for _, w := range want {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w[:strings.Index(w, "{")+1]) + w[strings.Index(w, "{")+1:] + `$`).MatchString(body) {
				out = append(out, w)
			}
		}
		return out
	}
	testenv.PollFor(t, "every family docs/metrics.md lists on /metrics", 200*time.Millisecond, e2eWait, func() (bool, string) {
		last := missing()
		return len(last) == 0, fmt.Sprintf("missing %q from:\n%s", last, body)
	})
}
