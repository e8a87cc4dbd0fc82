package intent

import (
	"slices"
	"testing"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

func TestAssessTLS(t *testing.T) {
	cronJob := func(labels, schedule, command, extraMount, extraVolume string) string {
		return `
apiVersion: batch/v1
kind: CronJob
metadata:
  name: all-assesstls
  namespace: nimbus-k8tls-env` + labels + `
  annotations: {app.kubernetes.io/managed-by: nimbus-k8tls}` + clusterOwner + `
spec:
  schedule: '` + schedule + `'
  jobTemplate:
    spec:
      backoffLimit: 5
      template:
        spec:
          restartPolicy: Never
          serviceAccountName: k8tls
          initContainers:
          - name: k8tls
            image: kubearmor/k8tls:latest
            imagePullPolicy: Always
            command: ` + command + `
            volumeMounts:
            - {name: fips-config, mountPath: /home/k8tls/config/, readOnly: true}
            - {name: k8tls-report, mountPath: /tmp/}` + extraMount + `
          containers:
          - name: fluent-bit
            image: fluent/fluent-bit:latest
            imagePullPolicy: Always
            volumeMounts:
            - {name: fluent-bit-config, mountPath: /fluent-bit/etc/fluent-bit.conf, subPath: fluent-bit.conf, readOnly: true}
            - {name: k8tls-report, mountPath: /tmp/}
          volumes:
          - {name: fips-config, configMap: {name: fips-config}}
          - {name: fluent-bit-config, configMap: {name: fluent-bit-config}}
          - {name: k8tls-report, emptyDir: {}}` + extraVolume + `
`
	}
	all := intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}}

	t.Run("on the rule's schedule, for its external addresses, in its own ConfigMap", func(t *testing.T) {
		cnp := clusterNimbusPolicy(all, nil,
			rule(DNSManipulation, "Block", map[string]intentv1alpha1.ParamValues{"schedule": {"@daily"}}),
			rule(AssessTLS, "Audit", map[string]intentv1alpha1.ParamValues{
				"schedule":           {"0 23 * * SUN"},
				"external_addresses": {"dh480.badssl.com:443", "google.com:443", "", "localhost"},
			}))
		cnp.Labels = map[string]string{"team": "sec"}
		got := ForClusterNimbusPolicy(cnp)
		if len(got) != 2 || got[0].Engine != K8TLS || got[1].Engine != K8TLS {
			t.Fatalf("policies %+v", got)
		}
		if got[0].Entry != "" || got[1].Entry != "nimbus-k8tls-env/CronJob/all-assesstls" {
			t.Errorf("entries %q", entries(got))
		}
		assertObject(t, got[0].Object.Object, `
apiVersion: v1
kind: ConfigMap
metadata:
  name: all-assesstls-addresses
  namespace: nimbus-k8tls-env
  annotations: {app.kubernetes.io/managed-by: nimbus-k8tls}`+clusterOwner+`
data:
  addresses: "dh480.badssl.com:443 Dh480\ngoogle.com:443 Google\nlocalhost Localhost"
`)
		assertObject(t, got[1].Object.Object, cronJob("\n  labels: {team: sec}", "0 23 * * SUN",
			"[./tlsscan, --infile, /var/k8tls/addresses, --compact-json]",
			"\n            - {name: external-addresses, mountPath: /var/k8tls/, readOnly: true}",
			"\n          - {name: external-addresses, configMap: {name: all-assesstls-addresses}}"))
	})
	t.Run("weekly by default, the cluster's endpoints, the first assessTLS rule", func(t *testing.T) {
		cnp := clusterNimbusPolicy(all, nil,
			rule(AssessTLS, "Audit", map[string]intentv1alpha1.ParamValues{"external_addresses": {}}),
			rule(AssessTLS, "Audit", map[string]intentv1alpha1.ParamValues{"schedule": {"@daily"}}))
		got := ForClusterNimbusPolicy(cnp)
		if len(got) != 1 {
			t.Fatalf("entries %q", entries(got))
		}
		assertObject(t, got[0].Object.Object, cronJob("", "@weekly", "[./k8s_tlsscan]", "", ""))
	})
	t.Run("with escapeToHost, in rule order", func(t *testing.T) {
		cnp := clusterNimbusPolicy(all, nil, rule(AssessTLS, "Audit", nil), rule(EscapeToHost, "Block", nil))
		want := []string{"nimbus-k8tls-env/CronJob/all-assesstls", "KyvernoClusterPolicy/all-escapetohost"}
		if got := entries(ForClusterNimbusPolicy(cnp)); !slices.Equal(got, want) {
			t.Errorf("entries %q, want %q", got, want)
		}
	})
	t.Run("nothing on a NimbusPolicy", func(t *testing.T) {
		if got := ForNimbusPolicy(nimbusPolicy(rule(AssessTLS, "Audit", nil)), Inputs{}); len(got) != 0 {
			t.Errorf("entries %q", entries(got))
		}
	})
}
