package nsrequest

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Names of the objects made inside a requested namespace.
const (
	ServiceAccountName  = "admin"
	AdminBindingName    = "quartermaster-admin"
	SelfRoleName        = "quartermaster-namespace-self"
	DefaultsObjectsName = "quartermaster-defaults"
)

// Defaults are the optional objects every requested namespace gets, read from the file given by
// --namespace-defaults: the top level is the profile every request gets, and profiles are named
// alternatives that a TrustedIssuer rule may give the namespaces its jobs ask for
// (spec.rules[].defaults; the exchange records the choice in the request's AnnotationDefaults).
// Example:
//
//	resourceQuota:
//	  hard: {requests.cpu: "4", requests.memory: 8Gi, pods: "50"}
//	limitRange:
//	  limits:
//	    - type: Container
//	      default: {cpu: 500m, memory: 512Mi}
//	      defaultRequest: {cpu: 100m, memory: 128Mi}
//	isolateNetwork: true
//	copy:
//	  secrets: [registry-pull]
//	  configMaps: [corporate-ca]
//	profiles:
//	  pull-requests:
//	    resourceQuota: {hard: {requests.cpu: "1", pods: "10"}}
//	    isolateNetwork: true
type Defaults struct {
	Profile `json:",inline"`
	// Profiles are the named alternatives to the top level (a profile holds what it names and
	// nothing of the top level).
	Profiles map[string]Profile `json:"profiles,omitempty"`
}

// Profile is one set of defaults.
type Profile struct {
	ResourceQuota *corev1.ResourceQuotaSpec `json:"resourceQuota,omitempty"`
	LimitRange    *corev1.LimitRangeSpec    `json:"limitRange,omitempty"`
	// IsolateNetwork adds a NetworkPolicy that admits ingress only from pods of the same namespace.
	IsolateNetwork bool `json:"isolateNetwork,omitempty"`
	// Copy names Secrets and ConfigMaps of the --copy-from-namespace that every namespace gets a copy
	// of, kept as their source is and removed when dropped from this list.
	Copy Copies `json:"copy,omitempty"`
}

// AnnotationDefaults on a request names the profile of the defaults its namespace gets (absent:
// the top level). Only the exchange writes it (the admission policy
// quartermaster-exchange-requests keeps it from everyone else).
const AnnotationDefaults = "quartermaster.dev/defaults"

// maxProfiles bounds the profiles of a defaults file.
const maxProfiles = 20

// ProfileNamed returns the profile named name ("" is the top level), or an error naming the ones
// there are.
func (d *Defaults) ProfileNamed(name string) (*Profile, error) {
	if name == "" {
		return &d.Profile, nil
	}
	if p, ok := d.Profiles[name]; ok {
		return &p, nil
	}
	names := slices.Sorted(maps.Keys(d.Profiles))
	if len(names) == 0 {
		return nil, fmt.Errorf("defaults profile %q is not defined: --namespace-defaults defines no profiles", name)
	}
	return nil, fmt.Errorf("defaults profile %q is not defined in --namespace-defaults (profiles: %s)", name, strings.Join(names, ", "))
}

// Copying says whether any profile copies objects.
func (d *Defaults) Copying() bool {
	if !d.Copy.Empty() {
		return true
	}
	for _, p := range d.Profiles {
		if !p.Copy.Empty() {
			return true
		}
	}
	return false
}

// validate checks the profiles' names and what they copy.
func (d *Defaults) validate() error {
	if err := d.Copy.validate(); err != nil {
		return err
	}
	if len(d.Profiles) > maxProfiles {
		return fmt.Errorf("%d profiles, at most %d", len(d.Profiles), maxProfiles)
	}
	for _, name := range slices.Sorted(maps.Keys(d.Profiles)) {
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			return fmt.Errorf("profiles: %q is no profile name (a DNS label): %s", name, strings.Join(errs, "; "))
		}
		p := d.Profiles[name]
		if err := p.Copy.validate(); err != nil {
			return fmt.Errorf("profiles.%s: %w", name, err)
		}
	}
	return nil
}

// Copies are the shared objects every requested namespace gets a copy of, by name.
type Copies struct {
	Secrets    []string `json:"secrets,omitempty"`
	ConfigMaps []string `json:"configMaps,omitempty"`
}

// Empty says whether nothing is copied.
func (c Copies) Empty() bool { return len(c.Secrets)+len(c.ConfigMaps) == 0 }

// Copy labels: a source must carry LabelCopySource=true (a deliberate mark: an object that lacks it
// is never copied, whatever the defaults name); each copy carries LabelCopyOf with its source's name.
const (
	LabelCopySource = "quartermaster.dev/copy-source"
	LabelCopyOf     = "quartermaster.dev/copy-of"
)

// maxCopies bounds each list of Copies.
const maxCopies = 20

// validate checks the names of the objects to copy.
func (c Copies) validate() error {
	for kind, names := range map[string][]string{"secrets": c.Secrets, "configMaps": c.ConfigMaps} {
		if len(names) > maxCopies {
			return fmt.Errorf("copy.%s names %d objects, at most %d", kind, len(names), maxCopies)
		}
		seen := map[string]bool{}
		for _, n := range names {
			if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
				return fmt.Errorf("copy.%s: %q is no object name: %s", kind, n, strings.Join(errs, "; "))
			}
			if seen[n] {
				return fmt.Errorf("copy.%s names %q twice", kind, n)
			}
			seen[n] = true
		}
	}
	return nil
}

// CopyOf is the copy of a source Secret or ConfigMap (as read) in the requested namespace name:
// its content, the request's labels and LabelCopyOf.
func CopyOf(requestsNamespace, name string, source client.Object) client.Object {
	m := meta(requestsNamespace, name, source.GetName())
	m.Labels[LabelCopyOf] = source.GetName()
	switch s := source.(type) {
	case *corev1.Secret:
		return &corev1.Secret{ObjectMeta: m, Type: s.Type, Data: s.Data}
	case *corev1.ConfigMap:
		return &corev1.ConfigMap{ObjectMeta: m, Data: s.Data, BinaryData: s.BinaryData}
	}
	return nil
}

// LoadDefaults reads a defaults file; an empty path means no defaults.
func LoadDefaults(path string) (*Defaults, error) {
	d := &Defaults{}
	if path == "" {
		return d, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict(data, d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := d.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// Labels returns the labels of every object made for a request.
func Labels(requestsNamespace, name string) map[string]string {
	return map[string]string{LabelManagedBy: ManagedByValue, LabelRequest: RequestLabel(requestsNamespace, name)}
}

// meta is the metadata of an object made in the requested namespace: the request's labels and no
// annotation of its own (the Namespace names the request in full), so that what the cache keeps of
// its annotations (the drift hash, the same for objects made alike in every namespace) is one
// shared copy.
func meta(requestsNamespace, name, objName string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: objName, Namespace: name, Labels: Labels(requestsNamespace, name)}
}

// Namespace returns the namespace to create, now, for the request ConfigMap with UID requestUID.
func Namespace(requestsNamespace string, req *Request, requestUID types.UID, now time.Time) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: req.Namespace, Labels: Labels(requestsNamespace, req.Namespace),
		Annotations: map[string]string{AnnotationRequest: requestsNamespace + "/" + req.Namespace},
	}}
	ns.Annotations[AnnotationRequestUID] = string(requestUID)
	if req.TTL > 0 {
		ns.Annotations[AnnotationExpiresAt] = now.Add(req.TTL).UTC().Format(time.RFC3339)
	}
	return ns
}

// NamespaceObjects returns what the operator keeps inside a requested namespace: the admin
// ServiceAccount and its bindings, then the defaults of its profile d.
func NamespaceObjects(requestsNamespace, name string, d *Profile) []client.Object {
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: meta(requestsNamespace, name, ServiceAccountName)},
		&rbacv1.RoleBinding{
			ObjectMeta: meta(requestsNamespace, name, AdminBindingName),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServiceAccountName, Namespace: name}},
		},
		// A pipeline tears its namespace down when done: it may get and delete this Namespace only.
		&rbacv1.Role{
			ObjectMeta: meta(requestsNamespace, name, SelfRoleName),
			Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{""}, Resources: []string{"namespaces"},
				ResourceNames: []string{name}, Verbs: []string{"get", "delete"},
			}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: meta(requestsNamespace, name, SelfRoleName),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: SelfRoleName},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServiceAccountName, Namespace: name}},
		},
	}
	if d.ResourceQuota != nil {
		objs = append(objs, &corev1.ResourceQuota{ObjectMeta: meta(requestsNamespace, name, DefaultsObjectsName), Spec: *d.ResourceQuota.DeepCopy()})
	}
	if d.LimitRange != nil {
		objs = append(objs, &corev1.LimitRange{ObjectMeta: meta(requestsNamespace, name, DefaultsObjectsName), Spec: *d.LimitRange.DeepCopy()})
	}
	if d.IsolateNetwork {
		objs = append(objs, &networkingv1.NetworkPolicy{
			ObjectMeta: meta(requestsNamespace, name, DefaultsObjectsName),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}},
			},
		})
	}
	return objs
}
