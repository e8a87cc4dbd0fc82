package intents

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// testAssessTLS: a cluster binding of assessTLS waits for nimbus-k8tls (its namespace and
// ServiceAccount), then makes the scan's CronJob there, and its addresses' ConfigMap while the
// rule lists addresses; hand edits and deletions are reverted.
func testAssessTLS(t *testing.T, f *fixture) {
	ctx := context.Background()
	si := f.intent(t, "assess-tls", intent.AssessTLS, map[string]intentv1alpha1.ParamValues{"schedule": {"0 23 * * SUN"}})
	csib := &intentv1alpha1.ClusterSecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tls"},
		Spec: intentv1alpha1.ClusterSecurityIntentBindingSpec{
			Intents:  []intentv1alpha1.MatchIntent{{Name: si.Name}},
			Selector: intentv1alpha1.ClusterMatchWorkloads{NsSelector: intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}}},
		},
	}
	must(t, f.c.Create(ctx, csib))
	cnp := &intentv1alpha1.ClusterNimbusPolicy{ObjectMeta: metav1.ObjectMeta{Name: "tls"}}
	const cronJob = "tls-assesstls"
	const addresses = "tls-assesstls-addresses"
	waitCNP := func(t *testing.T, reason string, entries ...string) {
		t.Helper()
		eventually(t, fmt.Sprintf("ClusterNimbusPolicy %s with %v", reason, entries), func() (bool, string) {
			if err := f.c.Get(ctx, client.ObjectKeyFromObject(cnp), cnp); err != nil {
				return false, err.Error()
			}
			c := meta.FindStatusCondition(cnp.Status.Conditions, "Ready")
			return c != nil && c.Reason == reason && c.ObservedGeneration == cnp.Generation && slices.Equal(cnp.Status.Policies, entries),
				fmt.Sprintf("%v %v", cnp.Status.Policies, c)
		})
	}
	cronJobSpec := func(t *testing.T) batchv1.CronJobSpec {
		t.Helper()
		cj := &batchv1.CronJob{}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: intent.K8TLSNamespace, Name: cronJob}, cj))
		if !metav1.IsControlledBy(cj, cnp) {
			t.Errorf("CronJob owners %+v, want the ClusterNimbusPolicy as controller", cj.OwnerReferences)
		}
		return cj.Spec
	}

	t.Run("without nimbus-k8tls, nothing is made and the status says why", func(t *testing.T) {
		waitCNP(t, "EngineNotInstalled")
		if c := meta.FindStatusCondition(cnp.Status.Conditions, "Ready"); !strings.Contains(c.Message, string(intent.K8TLS)) {
			t.Errorf("Ready message %q does not name %s", c.Message, intent.K8TLS)
		}
	})

	t.Run("nimbus-k8tls installed: the scan's CronJob on the rule's schedule", func(t *testing.T) {
		f.namespace(t, intent.K8TLSNamespace)
		must(t, f.c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: intent.K8TLSNamespace, Name: intent.K8TLSServiceAccount}}))
		waitCNP(t, "Generated", intent.K8TLSNamespace+"/CronJob/"+cronJob)
		spec := cronJobSpec(t)
		pod := spec.JobTemplate.Spec.Template.Spec
		if spec.Schedule != "0 23 * * SUN" || pod.ServiceAccountName != intent.K8TLSServiceAccount || len(pod.InitContainers) != 1 ||
			!slices.Equal(pod.InitContainers[0].Command, []string{"./k8s_tlsscan"}) {
			t.Errorf("CronJob spec %+v", spec)
		}
	})

	t.Run("addresses add their ConfigMap and the scan reads it", func(t *testing.T) {
		f.get(t, si)
		base := si.DeepCopy()
		si.Spec.Intent.Params["external_addresses"] = []string{"example.com:443"}
		// A patch of the spec, as kubectl edit makes it: the controller writes the intent's status
		// meanwhile.
		must(t, f.c.Patch(ctx, si, client.MergeFrom(base)))
		eventually(t, "the addresses' ConfigMap and the CronJob reading it", func() (bool, string) {
			cm := &corev1.ConfigMap{}
			if err := f.c.Get(ctx, client.ObjectKey{Namespace: intent.K8TLSNamespace, Name: addresses}, cm); err != nil {
				return false, err.Error()
			}
			cmd := cronJobSpec(t).JobTemplate.Spec.Template.Spec.InitContainers[0].Command
			return cm.Data["addresses"] == "example.com:443 Example" && slices.Contains(cmd, "--infile"), fmt.Sprint(cm.Data, cmd)
		})
		waitCNP(t, "Generated", intent.K8TLSNamespace+"/CronJob/"+cronJob)
	})

	t.Run("a CronJob edited or deleted by hand comes back", func(t *testing.T) {
		cj := &batchv1.CronJob{}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: intent.K8TLSNamespace, Name: cronJob}, cj))
		cj.Spec.Schedule = "* * * * *"
		must(t, f.c.Update(ctx, cj))
		eventually(t, "the schedule reverted", func() (bool, string) {
			s := cronJobSpec(t).Schedule
			return s == "0 23 * * SUN", s
		})
		must(t, f.c.Delete(ctx, cj))
		eventually(t, "the CronJob made again", func() (bool, string) {
			got := &batchv1.CronJob{}
			err := f.c.Get(ctx, client.ObjectKeyFromObject(cj), got)
			return err == nil && got.UID != cj.UID, fmt.Sprint(err)
		})
	})

	t.Run("addresses removed: their ConfigMap is deleted", func(t *testing.T) {
		f.get(t, si)
		base := si.DeepCopy()
		delete(si.Spec.Intent.Params, "external_addresses")
		must(t, f.c.Patch(ctx, si, client.MergeFrom(base))) // the controller writes its status meanwhile
		eventually(t, "the addresses' ConfigMap deleted", func() (bool, string) {
			err := f.c.Get(ctx, client.ObjectKey{Namespace: intent.K8TLSNamespace, Name: addresses}, &corev1.ConfigMap{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		waitCNP(t, "Generated", intent.K8TLSNamespace+"/CronJob/"+cronJob)
	})
}
