package intent

import (
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// The intent ids of the catalogue.
const (
	DNSManipulation           = "dnsManipulation"
	SwDeploymentTools         = "swDeploymentTools"
	UnAuthorizedSaTokenAccess = "unAuthorizedSaTokenAccess"
	PreventExecFromTempOrLogs = "preventExecutionFromTempOrLogsFolders"
	EscapeToHost              = "escapeToHost"
	DenyExternalNetworkAccess = "denyExternalNetworkAccess"
	CocoWorkload              = "cocoWorkload"
	VirtualPatch              = "virtualPatch"
	AssessTLS                 = "assessTLS"
)

// Engine is a policy engine the catalogue generates for, by the kinds it must have served.
type Engine string

// The engines, in the order their policies are listed for one rule.
const (
	KubeArmor     Engine = "KubeArmor"
	NetworkPolicy Engine = "NetworkPolicy"
	Kyverno       Engine = "Kyverno"
	// K8TLS is the TLS scanner nimbus-k8tls deploys: its kinds are built in, so it is there when
	// its namespace (K8TLSNamespace) and ServiceAccount (K8TLSServiceAccount) are.
	K8TLS Engine = "K8TLS"
)

// JoinEngines is the engines' names as messages list them: "KubeArmor, Kyverno".
func JoinEngines(es []Engine) string {
	names := make([]string, 0, len(es))
	for _, e := range es {
		names = append(names, string(e))
	}
	return strings.Join(names, ", ")
}

// Kinds the engines generate and are detected by (NetworkPolicy, CronJob and ConfigMap are built
// into Kubernetes).
var (
	KubeArmorPolicyKind      = schema.GroupVersionKind{Group: "security.kubearmor.com", Version: "v1", Kind: "KubeArmorPolicy"}
	NetworkPolicyKind        = schema.GroupVersionKind{Group: "networking.k8s.io", Version: "v1", Kind: "NetworkPolicy"}
	KyvernoPolicyKind        = schema.GroupVersionKind{Group: "kyverno.io", Version: "v1", Kind: "Policy"}
	KyvernoClusterPolicyKind = schema.GroupVersionKind{Group: "kyverno.io", Version: "v1", Kind: "ClusterPolicy"}
	CronJobKind              = schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "CronJob"}
	ConfigMapKind            = schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
)

// EngineKinds maps each engine to the kinds it generates.
var EngineKinds = map[Engine][]schema.GroupVersionKind{
	KubeArmor:     {KubeArmorPolicyKind},
	NetworkPolicy: {NetworkPolicyKind},
	Kyverno:       {KyvernoPolicyKind, KyvernoClusterPolicyKind},
	K8TLS:         {CronJobKind, ConfigMapKind},
}

// Implementations lists, per intent id, the engines that enforce it on a NimbusPolicy.
var Implementations = map[string][]Engine{
	DNSManipulation:           {KubeArmor, NetworkPolicy},
	SwDeploymentTools:         {KubeArmor},
	UnAuthorizedSaTokenAccess: {KubeArmor},
	PreventExecFromTempOrLogs: {KubeArmor},
	EscapeToHost:              {KubeArmor, Kyverno},
	DenyExternalNetworkAccess: {NetworkPolicy},
	CocoWorkload:              {Kyverno},
	VirtualPatch:              {Kyverno},
}

// ClusterImplementations lists, per intent id, the engines that enforce it on a
// ClusterNimbusPolicy directly (the others act through the per-namespace NimbusPolicies).
// virtualPatch has none: Nimbus makes an empty, invalid ClusterPolicy of it.
var ClusterImplementations = map[string][]Engine{
	EscapeToHost: {Kyverno},
	CocoWorkload: {Kyverno},
	AssessTLS:    {K8TLS},
}

// Scanned lists, per intent id, the engine whose policies for it are checked against the existing
// workloads and reported on: Kyverno's background scans of its validate rules (escapeToHost's pod
// security standard). Its mutate and generate rules (cocoWorkload, virtualPatch) find nothing to
// report, and KubeArmor and NetworkPolicy act on what runs from now on without a report.
var Scanned = map[string]Engine{EscapeToHost: Kyverno}

// Policy is one generated engine object.
type Policy struct {
	Engine Engine
	Object *unstructured.Unstructured
	// Entry is how the parent's status.adapterPolicies lists it (Kind/name, Nimbus's spelling);
	// empty for an object the status does not list (assessTLS's ConfigMap).
	Entry string
}

// Inputs are the cluster facts some policies need.
type Inputs struct {
	// PodCIDRs of the nodes, in node order: NetworkPolicies allow traffic to and from them.
	PodCIDRs []string
	// Deployments of the NimbusPolicy's namespace, in any order: cocoWorkload moves the existing
	// ones its selector picks to the RuntimeClass.
	Deployments []Workload
	// Engines are the engines installed and enabled: virtualPatch writes generators only of their
	// kinds (Kyverno refuses a generate rule of a kind the cluster does not serve). Nil: every
	// engine.
	Engines func(Engine) bool
}

// has reports whether in allows policies of engine e.
func (in Inputs) has(e Engine) bool {
	return in.Engines == nil || in.Engines(e)
}

// Workload is what the catalogue needs of a workload object.
type Workload struct {
	Name   string
	Labels map[string]string
}

// ManagedBy is the annotation every generated object carries, naming the Nimbus adapter that would
// have made it (tools that select Nimbus's objects by it keep working).
const ManagedBy = "app.kubernetes.io/managed-by"

// ForNimbusPolicy returns the engine policies of a NimbusPolicy, rule by rule in its order and,
// within a rule, engine by engine. A NimbusPolicy a cluster binding made gets no Kyverno policies:
// the cluster binding's ClusterNimbusPolicy has the ClusterPolicy for every namespace (as in Nimbus).
func ForNimbusPolicy(np *intentv1alpha1.NimbusPolicy, in Inputs) []Policy {
	owner := ownerRef(intentv1alpha1.GroupVersion.WithKind("NimbusPolicy"), np.Name, np.UID)
	cluster := ClusterGenerated(np)
	var out []Policy
	for _, r := range np.Spec.NimbusRules {
		p := parent{name: np.Name, namespace: np.Namespace, owner: owner, labels: np.Spec.Selector.MatchLabels}
		for _, e := range Implementations[r.ID] {
			if cluster && slices.Contains(ClusterImplementations[r.ID], e) {
				continue
			}
			switch e {
			case KubeArmor:
				out = append(out, kubeArmorPolicies(p, r)...)
			case NetworkPolicy:
				out = append(out, networkPolicy(p, r, in.PodCIDRs))
			case Kyverno:
				out = append(out, kyvernoPolicies(p, r, in)...)
			}
		}
	}
	return out
}

// ClusterGenerated reports whether a cluster binding made the NimbusPolicy.
func ClusterGenerated(np *intentv1alpha1.NimbusPolicy) bool {
	ref := metav1.GetControllerOf(np)
	return ref != nil && ref.Kind == "ClusterSecurityIntentBinding"
}

// kyvernoPolicies are a rule's Kyverno Policies on a NimbusPolicy.
func kyvernoPolicies(p parent, r intentv1alpha1.NimbusRules, in Inputs) []Policy {
	switch r.ID {
	case EscapeToHost:
		return []Policy{kyvernoPolicy(p, r)}
	case CocoWorkload:
		return cocoWorkloadPolicies(p, r, in.Deployments)
	case VirtualPatch:
		return virtualPatchPolicies(p, r, in)
	}
	return nil
}

// ForClusterNimbusPolicy returns the cluster-wide engine policies of a ClusterNimbusPolicy (and
// the objects assessTLS makes in K8TLSNamespace), rule by rule in its order.
func ForClusterNimbusPolicy(cnp *intentv1alpha1.ClusterNimbusPolicy) []Policy {
	owner := ownerRef(intentv1alpha1.GroupVersion.WithKind("ClusterNimbusPolicy"), cnp.Name, cnp.UID)
	var out []Policy
	assessed := false
	for _, r := range cnp.Spec.NimbusRules {
		for _, e := range ClusterImplementations[r.ID] {
			switch {
			case e == Kyverno && r.ID == EscapeToHost:
				out = append(out, kyvernoClusterPolicy(cnp, owner, r))
			case e == Kyverno && r.ID == CocoWorkload:
				out = append(out, cocoWorkloadClusterPolicy(cnp, owner, r))
			case e == K8TLS && !assessed:
				// One CronJob name per ClusterNimbusPolicy: the first assessTLS rule is the one
				// that runs, as in Nimbus.
				out = append(out, assessTLSObjects(cnp, owner, r)...)
				assessed = true
			}
		}
	}
	return out
}

// Unenforced lists what nothing enforces of the rules: the ids no engine implements, then the
// CVEs the built-in virtual patches do not cover.
func Unenforced(rules []intentv1alpha1.NimbusRules, cluster bool) []string {
	var out []string
	for _, r := range rules {
		if len(Implementations[r.ID]) == 0 && (!cluster || len(ClusterImplementations[r.ID]) == 0) {
			out = append(out, r.ID)
		}
	}
	for _, r := range rules {
		for _, cve := range UnpatchedCVEs(r) {
			out = append(out, "virtualPatch "+cve+" (no virtual patch known)")
		}
	}
	return out
}

// parent is what a namespaced engine policy takes from its NimbusPolicy.
type parent struct {
	name, namespace string
	owner           map[string]any
	labels          map[string]string
}

// ownerRef is the controller reference every generated object carries to its parent.
func ownerRef(gvk schema.GroupVersionKind, name string, uid types.UID) map[string]any {
	return map[string]any{
		"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind, "name": name, "uid": string(uid),
		"controller": true, "blockOwnerDeletion": true,
	}
}

// object assembles an engine object.
func object(gvk schema.GroupVersionKind, name, namespace string, annotations map[string]any, owner map[string]any, spec map[string]any) *unstructured.Unstructured {
	meta := map[string]any{"name": name, "annotations": annotations, "ownerReferences": []any{owner}}
	if namespace != "" {
		meta["namespace"] = namespace
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind, "metadata": meta, "spec": spec,
	}}
}

// PolicyName is Nimbus's name of an engine policy: the parent's name and the lowercased id.
func PolicyName(parent, id string) string {
	return parent + "-" + strings.ToLower(id)
}

func matchLabels(labels map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range labels {
		out[k] = v
	}
	return out
}
