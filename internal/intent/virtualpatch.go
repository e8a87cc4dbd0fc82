package intent

import (
	_ "embed"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// virtualPatchData is what virtualPatch generates from, in the format of Nimbus's vp.json: per
// image, its CVEs and each CVE's virtual patches, each one engine's manifest under the engine's
// key. It is built in: Nimbus opens it by a relative path its image does not ship.
//
//go:embed vp.json
var virtualPatchData []byte

type vulnerableImage struct {
	Image string `json:"image"`
	CVEs  []struct {
		CVE          string                       `json:"cve"`
		VirtualPatch []map[string]json.RawMessage `json:"virtual_patch"`
	} `json:"cves"`
}

var vulnerableImages = parseVirtualPatches(virtualPatchData)

func parseVirtualPatches(data []byte) []vulnerableImage {
	var images []vulnerableImage
	if err := json.Unmarshal(data, &images); err != nil {
		panic("intent: the built-in vp.json is invalid: " + err.Error()) // a build defect the tests catch
	}
	return images
}

// patchEngine is an engine a virtual patch is written for: its key in vp.json and the kind a
// generator Policy makes of the manifest.
type patchEngine struct {
	key    string
	kind   schema.GroupVersionKind
	engine Engine
}

// patchEngines in the order Nimbus looks for them in a virtual patch.
var patchEngines = []patchEngine{
	{"karmor", KubeArmorPolicyKind, KubeArmor},
	{"kyverno", KyvernoPolicyKind, Kyverno},
	{"netpol", NetworkPolicyKind, NetworkPolicy},
}

// cveList is the rule's own cveList param (cve_list, the spelling of Nimbus's docs, too).
// (Nimbus reads the first rule's params for every rule.)
func cveList(r intentv1alpha1.NimbusRules) []string {
	for _, key := range []string{"cveList", "cve_list"} {
		if v := r.Rule.Params[key]; len(v) > 0 {
			return v
		}
	}
	return nil
}

// UnpatchedCVEs returns the CVEs a virtualPatch rule lists that the built-in data has no virtual
// patch for, in the rule's order: nothing is generated for them.
func UnpatchedCVEs(r intentv1alpha1.NimbusRules) []string {
	if r.ID != VirtualPatch {
		return nil
	}
	var out []string
	for _, cve := range cveList(r) {
		if !patched(cve) && !slices.Contains(out, cve) {
			out = append(out, cve)
		}
	}
	return out
}

func patched(cve string) bool {
	for _, img := range vulnerableImages {
		for _, c := range img.CVEs {
			if c.CVE == cve && len(c.VirtualPatch) > 0 {
				return true
			}
		}
	}
	return false
}

// virtualPatchPolicies are virtualPatch's generator Policies: for each listed CVE (exact match)
// and each of its virtual patches, a Kyverno Policy that, once a selected pod runs the vulnerable
// image, generates the patch's policy in the namespace. Named <np>-<cve>-<engine>-<n>, n counting
// per CVE and engine from 1. (Nimbus also schedules the deletion of the NimbusPolicy to pick up new
// data: the data is built in here, so a new release brings it.)
func virtualPatchPolicies(p parent, r intentv1alpha1.NimbusRules, in Inputs) []Policy {
	wanted := cveList(r)
	count := map[string]int{}
	var out []Policy
	for _, img := range vulnerableImages {
		for _, c := range img.CVEs {
			if !slices.Contains(wanted, c.CVE) {
				continue
			}
			cve := strings.ToLower(c.CVE)
			for _, patch := range c.VirtualPatch {
				for _, e := range patchEngines {
					manifest, ok := patch[e.key]
					if !ok || !in.has(e.engine) {
						continue
					}
					rule, ok := generatorRule(p, e, cve, img.Image, failureAction(r.Rule.RuleAction), manifest)
					if !ok {
						continue
					}
					count[cve+"/"+e.key]++ // across images too, so that no two names collide
					name := p.name + "-" + cve + "-" + e.key + "-" + strconv.Itoa(count[cve+"/"+e.key])
					out = append(out, generatorPolicy(p, r, name, rule))
				}
			}
		}
	}
	return out
}

func generatorPolicy(p parent, r intentv1alpha1.NimbusRules, name string, rule map[string]any) Policy {
	spec := map[string]any{"background": true, "rules": []any{rule}}
	obj := object(KyvernoPolicyKind, name, p.namespace, kyvernoAnnotations(r), p.owner, spec)
	return Policy{Engine: Kyverno, Object: obj, Entry: "KyvernoPolicy/" + name}
}

func contextVariable(name, jmesPath string) map[string]any {
	return map[string]any{"name": name, "variable": map[string]any{"jmesPath": jmesPath}}
}

// patchKyvernoRules makes the generated Policy's first rule apply to the same pods when they run
// the image: its own "all" preconditions give way, its "any" ones join the image's (as in
// Nimbus); false when the Policy has no rule.
func patchKyvernoRules(p parent, spec, runsImage map[string]any, action string) bool {
	rules, _ := spec["rules"].([]any)
	if len(rules) == 0 {
		return false
	}
	first, ok := rules[0].(map[string]any)
	if !ok {
		return false
	}
	first["match"] = map[string]any{"any": []any{kindResources("Pod", nil, p.labels)}}
	conditions := []any{runsImage}
	if pre, ok := first["preconditions"].(map[string]any); ok {
		if anyOf, ok := pre["any"].([]any); ok {
			conditions = append(conditions, anyOf...)
		}
	}
	first["preconditions"] = map[string]any{"all": conditions}
	// The intent's action, not the data's, decides whether its validations block, as a
	// rule-level failureAction (Kyverno deprecates the spec-level one the data has).
	delete(spec, "validationFailureAction")
	for _, r := range rules {
		if rule, ok := r.(map[string]any); ok {
			if v, ok := rule["validate"].(map[string]any); ok {
				v["failureAction"] = action
			}
		}
	}
	return true
}

// generatorRule is the rule generating one virtual patch's policy for the NimbusPolicy's pods
// running image; false for a manifest it cannot use (Nimbus panics on some).
func generatorRule(p parent, e patchEngine, cve, image, action string, raw json.RawMessage) (map[string]any, bool) {
	var manifest map[string]any
	if err := utiljson.Unmarshal(raw, &manifest); err != nil { // integers as int64
		return nil, false
	}
	meta, _ := manifest["metadata"].(map[string]any)
	spec, _ := manifest["spec"].(map[string]any)
	name, _ := meta["name"].(string)
	if name == "" || spec == nil {
		return nil, false
	}
	delete(manifest, "apiVersion")
	delete(manifest, "kind")
	// What Kyverno generates is collected with the NimbusPolicy, but is not its controlled object:
	// a controller reference would make it look like a generated policy no longer wanted (and
	// blockOwnerDeletion would need Kyverno to update the NimbusPolicy's finalizers).
	owner := maps.Clone(p.owner)
	owner["controller"], owner["blockOwnerDeletion"] = false, false
	meta["ownerReferences"] = []any{owner}

	runsImage := map[string]any{"key": image, "operator": "AnyIn", "value": "{{ request.object.spec.containers[].image }}"}
	podName := contextVariable("podName", "request.object.metadata.name")
	rule := map[string]any{"match": map[string]any{"any": []any{kindResources(podKind, nil, p.labels)}}}
	generate := map[string]any{
		"apiVersion": e.kind.GroupVersion().String(), "kind": e.kind.Kind, "name": name, "namespace": p.namespace,
		"data": manifest,
	}
	switch e.key {
	case "karmor":
		// One KubeArmorPolicy per pod, for the container running the image.
		selector, _ := spec["selector"].(map[string]any)
		if selector == nil {
			selector = map[string]any{}
		}
		labels := matchLabels(p.labels)
		labels["kubearmor.io/container.name"] = "{{ containerName }}"
		selector["matchLabels"] = labels
		spec["selector"] = selector
		rule["name"] = cve + "virtual-patch-karmor"
		rule["preconditions"] = map[string]any{"all": []any{runsImage}}
		rule["context"] = []any{
			contextVariable("containerName", "request.object.spec.containers[?(@.image=='"+image+"')].name | [0]"),
			podName,
		}
		generate["name"] = name + "-{{ podName }}"
	case "kyverno":
		if !patchKyvernoRules(p, spec, runsImage, action) {
			return nil, false
		}
		rule["name"] = cve + "-virtual-patch-kyverno"
	case "netpol":
		selector, _ := spec["podSelector"].(map[string]any)
		if selector == nil {
			selector = map[string]any{}
		}
		delete(selector, "matchLabels")
		if len(p.labels) > 0 {
			selector["matchLabels"] = matchLabels(p.labels)
		}
		spec["podSelector"] = selector
		rule["name"] = cve + "virtual-patch-netpol"
		rule["preconditions"] = map[string]any{"all": []any{runsImage}}
		rule["context"] = []any{podName}
	}
	generate["generateExisting"] = true
	rule["generate"] = generate
	return rule, true
}
