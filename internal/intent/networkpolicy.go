package intent

import (
	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// privateRanges are the RFC 1918 ranges denyExternalNetworkAccess keeps reachable.
var privateRanges = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}

// kubeDNS is the peer of the cluster's DNS pods.
func kubeDNS() map[string]any {
	return map[string]any{
		"podSelector":       map[string]any{"matchLabels": map[string]any{"k8s-app": "kube-dns"}},
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "kube-system"}},
	}
}

func dnsPorts() []any {
	return []any{
		map[string]any{"protocol": "UDP", "port": int64(53)},
		map[string]any{"protocol": "TCP", "port": int64(53)},
	}
}

func cidrPeers(cidrs []string) []any {
	out := make([]any, 0, len(cidrs))
	for _, c := range cidrs {
		if c != "" { // a node without a pod CIDR yet: an empty block is invalid
			out = append(out, map[string]any{"ipBlock": map[string]any{"cidr": c}})
		}
	}
	return out
}

// networkPolicy is a rule's NetworkPolicy. dnsManipulation lets the selected pods resolve names
// only through the cluster's DNS (and reach the nodes' pod ranges on port 53);
// denyExternalNetworkAccess keeps their traffic within the pod and private ranges. (Nimbus puts
// port 53 on the one egress rule of the latter, which blocks every internal connection but DNS:
// here DNS and internal traffic are two rules.)
func networkPolicy(p parent, r intentv1alpha1.NimbusRules, podCIDRs []string) Policy {
	name := PolicyName(p.name, r.ID)
	podSelector := map[string]any{}
	if len(p.labels) > 0 {
		podSelector["matchLabels"] = matchLabels(p.labels)
	}
	spec := map[string]any{"podSelector": podSelector}
	switch r.ID {
	case DNSManipulation:
		to := append(cidrPeers(podCIDRs), kubeDNS())
		spec["egress"] = []any{map[string]any{"to": to, "ports": dnsPorts()}}
		spec["policyTypes"] = []any{"Egress"}
	case DenyExternalNetworkAccess:
		internal := append(cidrPeers(podCIDRs), cidrPeers(privateRanges)...)
		spec["ingress"] = []any{map[string]any{"from": internal}}
		spec["egress"] = []any{
			map[string]any{"to": []any{kubeDNS()}, "ports": dnsPorts()},
			map[string]any{"to": internal},
		}
		spec["policyTypes"] = []any{"Egress", "Ingress"}
	}
	obj := object(NetworkPolicyKind, name, p.namespace, map[string]any{ManagedBy: "nimbus-netpol"}, p.owner, spec)
	return Policy{Engine: NetworkPolicy, Object: obj, Entry: "NetworkPolicy/" + name}
}
