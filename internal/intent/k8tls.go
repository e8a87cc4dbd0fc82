package intent

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// Where assessTLS runs: the namespace and ServiceAccount nimbus-k8tls's chart installs (with the
// fips-config and fluent-bit-config ConfigMaps the scan mounts). The engine is there when both are.
const (
	K8TLSNamespace      = "nimbus-k8tls-env"
	K8TLSServiceAccount = "k8tls"
)

// DefaultTLSSchedule is how often assessTLS scans when its rule sets no schedule.
const DefaultTLSSchedule = "@weekly"

// addressesDir is where the scan reads the external addresses file from.
const addressesDir = "/var/k8tls/"

// firstParam is the first value of a rule's param, or def.
func firstParam(r intentv1alpha1.NimbusRules, key, def string) string {
	if v := r.Rule.Params[key]; len(v) > 0 && v[0] != "" {
		return v[0]
	}
	return def
}

// externalAddresses are the rule's external_addresses, as the scan's address file has them: one
// "<address> <Name>" line each, Name being the host's first label capitalized.
func externalAddresses(r intentv1alpha1.NimbusRules) []string {
	var lines []string
	for _, addr := range r.Rule.Params["external_addresses"] {
		if addr == "" {
			continue
		}
		host, _, _ := strings.Cut(addr, ":")
		label, _, _ := strings.Cut(host, ".")
		if label == "" { // Nimbus panics here
			label = addr
		}
		first, size := utf8.DecodeRuneInString(label)
		lines = append(lines, addr+" "+string(unicode.ToUpper(first))+label[size:])
	}
	return lines
}

// assessTLSObjects are assessTLS's CronJob <cnp>-assesstls in K8TLSNamespace, which scans the
// cluster's TLS endpoints (or the rule's external_addresses) on the rule's schedule, and, with
// addresses, the ConfigMap <cnp>-assesstls-addresses listing them (Nimbus names it
// external-addresses for every ClusterNimbusPolicy, so they overwrite each other's). The CronJob
// carries the ClusterNimbusPolicy's labels; only it has a status entry. (Nimbus's Elasticsearch
// variant, chosen by a Secret and an environment variable of its adapter, is left out.)
func assessTLSObjects(cnp *intentv1alpha1.ClusterNimbusPolicy, owner map[string]any, r intentv1alpha1.NimbusRules) []Policy {
	name := PolicyName(cnp.Name, r.ID)
	scan := map[string]any{
		"name": "k8tls", "image": "kubearmor/k8tls:latest", "imagePullPolicy": "Always",
		"command": []any{"./k8s_tlsscan"},
		"volumeMounts": []any{
			map[string]any{"name": "fips-config", "mountPath": "/home/k8tls/config/", "readOnly": true},
			map[string]any{"name": "k8tls-report", "mountPath": "/tmp/"},
		},
	}
	report := map[string]any{
		"name": "fluent-bit", "image": "fluent/fluent-bit:latest", "imagePullPolicy": "Always",
		"volumeMounts": []any{
			map[string]any{"name": "fluent-bit-config", "mountPath": "/fluent-bit/etc/fluent-bit.conf", "subPath": "fluent-bit.conf", "readOnly": true},
			map[string]any{"name": "k8tls-report", "mountPath": "/tmp/"},
		},
	}
	volumes := []any{
		configMapVolume("fips-config", "fips-config"),
		configMapVolume("fluent-bit-config", "fluent-bit-config"),
		map[string]any{"name": "k8tls-report", "emptyDir": map[string]any{}},
	}

	var out []Policy
	if addresses := externalAddresses(r); len(addresses) > 0 {
		cmName := name + "-addresses"
		cm := namespacedObject(ConfigMapKind, cmName, K8TLSNamespace, owner)
		// Marked as the CronJob is, so it is deleted with the rule's addresses (Nimbus's has no mark).
		cm.SetAnnotations(map[string]string{ManagedBy: "nimbus-k8tls"})
		cm.Object["data"] = map[string]any{"addresses": strings.Join(addresses, "\n")}
		out = append(out, Policy{Engine: K8TLS, Object: cm}) // before the CronJob that mounts it

		scan["command"] = []any{"./tlsscan", "--infile", addressesDir + "addresses", "--compact-json"}
		scan["volumeMounts"] = append(scan["volumeMounts"].([]any),
			map[string]any{"name": "external-addresses", "mountPath": addressesDir, "readOnly": true})
		volumes = append(volumes, configMapVolume("external-addresses", cmName))
	}

	cj := namespacedObject(CronJobKind, name, K8TLSNamespace, owner)
	if len(cnp.Labels) > 0 {
		cj.SetLabels(cnp.Labels)
	}
	cj.SetAnnotations(map[string]string{ManagedBy: "nimbus-k8tls"})
	cj.Object["spec"] = map[string]any{
		"schedule": firstParam(r, "schedule", DefaultTLSSchedule),
		"jobTemplate": map[string]any{"spec": map[string]any{
			"backoffLimit": int64(5),
			"template": map[string]any{"spec": map[string]any{
				"restartPolicy":      "Never",
				"serviceAccountName": K8TLSServiceAccount,
				"initContainers":     []any{scan},
				"containers":         []any{report},
				"volumes":            volumes,
			}},
		}},
	}
	return append(out, Policy{Engine: K8TLS, Object: cj, Entry: K8TLSNamespace + "/CronJob/" + name})
}

func configMapVolume(name, configMap string) map[string]any {
	return map[string]any{"name": name, "configMap": map[string]any{"name": configMap}}
}

// namespacedObject is an object with a name, a namespace and its owner, and nothing else yet.
func namespacedObject(gvk schema.GroupVersionKind, name, namespace string, owner map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind,
		"metadata": map[string]any{"name": name, "namespace": namespace, "ownerReferences": []any{owner}},
	}}
}
