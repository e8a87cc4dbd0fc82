package intent

import (
	"strings"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// softwareDeploymentTools are the package managers and downloaders swDeploymentTools blocks, in
// Nimbus's order (curl under /usr/local/bin twice, as Nimbus lists it).
var softwareDeploymentTools = []string{
	"/usr/bin/apt", "/usr/bin/apt-get", "/sbin/apk", "/bin/apt-get", "/bin/apt", "/usr/bin/dpkg", "/bin/dpkg",
	"/usr/bin/gdebi", "/bin/gdebi", "/usr/bin/make", "/bin/make", "/usr/bin/yum", "/bin/yum", "/usr/bin/rpm",
	"/bin/rpm", "/usr/bin/dnf", "/bin/dnf", "/usr/bin/pacman", "/usr/sbin/pacman", "/bin/pacman", "/sbin/pacman",
	"/usr/bin/makepkg", "/usr/sbin/makepkg", "/bin/makepkg", "/sbin/makepkg", "/usr/bin/yaourt", "/usr/sbin/yaourt",
	"/bin/yaourt", "/sbin/yaourt", "/usr/bin/zypper", "/bin/zypper", "/usr/bin/curl", "/bin/curl",
	"/usr/local/bin/curl", "/usr/bin/wget", "/bin/wget", "/usr/local/bin/curl",
}

// escapeToHostCapabilities are the capabilities escapeToHost's KubeArmor policy blocks.
var escapeToHostCapabilities = []string{"sys_admin", "sys_ptrace", "sys_module", "dac_read_search", "dac_override"}

// tempOrLogsFolders are where preventExecutionFromTempOrLogsFolders blocks execution.
var tempOrLogsFolders = []string{"/var/tmp/", "/tmp/", "/var/log/", "/app/logs/", "/logs/", "/etc/"}

// kubeArmorPolicies are a rule's KubeArmorPolicies: one per intent, three for escapeToHost
// (chroot, capabilities, software deployment tools), named <policy>-escapetohost-<sub>.
func kubeArmorPolicies(p parent, r intentv1alpha1.NimbusRules) []Policy {
	name := PolicyName(p.name, r.ID)
	switch r.ID {
	case DNSManipulation:
		return []Policy{kubeArmorPolicy(p, r, name, kubeArmorRules{
			file: map[string]any{"matchPaths": []any{map[string]any{"path": "/etc/resolv.conf", "readOnly": true}}},
		})}
	case UnAuthorizedSaTokenAccess:
		return []Policy{kubeArmorPolicy(p, r, name, kubeArmorRules{
			file: map[string]any{"matchDirectories": []any{map[string]any{"dir": "/run/secrets/kubernetes.io/serviceaccount/", "recursive": true}}},
		})}
	case SwDeploymentTools:
		return []Policy{kubeArmorPolicy(p, r, name, kubeArmorRules{process: paths(softwareDeploymentTools)})}
	case PreventExecFromTempOrLogs:
		dirs := make([]any, 0, len(tempOrLogsFolders))
		for _, d := range tempOrLogsFolders {
			dirs = append(dirs, map[string]any{"dir": d, "recursive": true})
		}
		return []Policy{kubeArmorPolicy(p, r, name, kubeArmorRules{
			process: map[string]any{"action": r.Rule.RuleAction, "matchDirectories": dirs},
		})}
	case EscapeToHost:
		caps := make([]any, 0, len(escapeToHostCapabilities))
		for _, c := range escapeToHostCapabilities {
			caps = append(caps, map[string]any{"capability": c})
		}
		return []Policy{
			kubeArmorPolicy(p, r, name+"-disallowchroot", kubeArmorRules{process: paths([]string{"/usr/sbin/chroot", "/sbin/chroot"})}),
			kubeArmorPolicy(p, r, name+"-disallowcapabilities", kubeArmorRules{capabilities: map[string]any{"matchCapabilities": caps}}),
			kubeArmorPolicy(p, r, name+"-"+strings.ToLower(SwDeploymentTools), kubeArmorRules{process: paths(softwareDeploymentTools)}),
		}
	}
	return nil
}

// kubeArmorRules are the rule sections of a KubeArmorPolicy; those left nil are empty objects,
// as KubeArmor's Go types serialize them.
type kubeArmorRules struct {
	process, file, capabilities map[string]any
}

func paths(ps []string) map[string]any {
	out := make([]any, 0, len(ps))
	for _, p := range ps {
		out = append(out, map[string]any{"path": p})
	}
	return map[string]any{"matchPaths": out}
}

func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// kubeArmorPolicy is one KubeArmorPolicy: the NimbusPolicy's selector, the rule's description as
// message and its action as KubeArmor's (Block or Audit, the same words).
func kubeArmorPolicy(p parent, r intentv1alpha1.NimbusRules, name string, rules kubeArmorRules) Policy {
	selector := map[string]any{}
	if len(p.labels) > 0 {
		selector["matchLabels"] = matchLabels(p.labels)
	}
	spec := map[string]any{
		"selector":     selector,
		"process":      orEmpty(rules.process),
		"file":         orEmpty(rules.file),
		"network":      map[string]any{},
		"capabilities": orEmpty(rules.capabilities),
		"syscalls":     map[string]any{},
		"action":       r.Rule.RuleAction,
	}
	if r.Description != "" {
		spec["message"] = r.Description
	}
	obj := object(KubeArmorPolicyKind, name, p.namespace, map[string]any{ManagedBy: "nimbus-kubearmor"}, p.owner, spec)
	return Policy{Engine: KubeArmor, Object: obj, Entry: "KubeArmorPolicy/" + name}
}
