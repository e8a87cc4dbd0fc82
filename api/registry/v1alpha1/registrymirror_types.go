package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RegistryMirrorSpec is the upstream a mirror caches and how the cache runs. Only upstreamUrl is
// required; every other field has the default a platform team would pick.
// +kubebuilder:validation:XValidation:rule="!has(self.masqueradeUrl) || !has(self.mirrorHost) || self.masqueradeUrl == self.mirrorHost",message="masqueradeUrl is the older name of mirrorHost: set one of them, or both to the same value"
// +kubebuilder:validation:XValidation:rule="self.upstreamUrl == oldSelf.upstreamUrl",message="upstreamUrl is immutable: the cache holds that upstream's content; create another RegistryMirror for another upstream"
// +kubebuilder:validation:XValidation:rule="has(self.mirrorHost) == has(oldSelf.mirrorHost) && (!has(self.mirrorHost) || self.mirrorHost == oldSelf.mirrorHost) && has(self.masqueradeUrl) == has(oldSelf.masqueradeUrl) && (!has(self.masqueradeUrl) || self.masqueradeUrl == oldSelf.masqueradeUrl)",message="mirrorHost (masqueradeUrl) is immutable: the nodes' files are named by it; create another RegistryMirror for another host"
// +kubebuilder:validation:XValidation:rule="has(self.storage) == has(oldSelf.storage) && (!has(self.storage) || self.storage == oldSelf.storage)",message="storage is immutable: a StatefulSet's volume claim templates cannot change; see docs/mirrors.md (Resizing the cache) for the procedure"
type RegistryMirrorSpec struct {
	// UpstreamURL is the root of the registry this mirror caches: "https://registry-1.docker.io",
	// "http://registry.internal:5000". A bare host ("quay.io", as the older k8s.osp.tech objects
	// have it) means https. No path: a registry is served at its root.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^(https?://)?[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?/?$')",message="upstreamUrl must be a registry root: http:// or https:// (or nothing, meaning https), a host name and an optional port, no path, query or credentials (e.g. https://registry-1.docker.io)"
	// +required
	UpstreamURL string `json:"upstreamUrl"`

	// CredentialsSecret names a Secret in the mirrors' namespace (the operator's
	// --mirrors-namespace, quartermaster-mirrors by default) with keys "username" and "password"
	// for the upstream. Empty: the upstream is pulled anonymously.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')",message="credentialsSecret must be a Secret name (lower case letters, digits, '-' and '.')"
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`

	// Replicas is the number of cache pods. They act as one cache: a pod that lacks content
	// asks the pod that owns its digest before the upstream, so the upstream serves each blob
	// once per mirror; any pod down, the others fetch its share themselves.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	// +kubebuilder:default=2
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Storage is each cache pod's volume. Immutable.
	// +optional
	Storage *Storage `json:"storage,omitempty"`

	// TTL is how long cached content is kept after it was last pulled through; "0s" keeps it
	// forever.
	// +kubebuilder:default="168h"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="ttl must be a duration of zero or more, e.g. 168h"
	// +optional
	TTL *metav1.Duration `json:"ttl,omitempty"`

	// MirrorHost is the registry host name whose pulls the nodes send to this mirror, as it
	// appears in image references ("docker.io" in docker.io/library/nginx). Default: the host of
	// upstreamUrl, and docker.io for registry-1.docker.io. Two mirrors of one host are refused.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$')",message="mirrorHost must be a host name with an optional port, as in image references (e.g. docker.io, registry.internal:5000)"
	// +optional
	MirrorHost string `json:"mirrorHost,omitempty"`

	// MasqueradeURL is the older k8s.osp.tech name of mirrorHost, accepted so those objects move
	// over unchanged. Prefer mirrorHost.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$')",message="masqueradeUrl must be a host name with an optional port (e.g. docker.io)"
	// +optional
	MasqueradeURL string `json:"masqueradeUrl,omitempty"`

	// ServiceType is how nodes reach the cache: ClusterIP (nodes use the Service's cluster IP,
	// through kube-proxy) or NodePort (nodes use 127.0.0.1:<nodePort>, for clusters whose nodes
	// do not route cluster IPs).
	// +kubebuilder:validation:Enum=ClusterIP;NodePort
	// +kubebuilder:default=ClusterIP
	// +optional
	ServiceType corev1.ServiceType `json:"serviceType,omitempty"`

	// NodeSelector limits the nodes whose containerd is pointed at the mirror.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations of the node agent, e.g. to configure tainted nodes too.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Resources of each cache container. Default: requests of 100m CPU and 128Mi memory.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// Eviction bounds how much of each cache pod's volume the cache fills: above highWaterPercent
	// used (as df counts it), the least recently pulled content is deleted until at most
	// lowWaterPercent is. Content pinned by use is never deleted. Unset: the marks' defaults (no
	// default object here: a stored mirror reads back as it was written).
	// +optional
	Eviction *Eviction `json:"eviction,omitempty"`

	// Prefetch lists images (as a Pod names them, e.g. docker.io/library/nginx:1.27 or
	// quay.io/team/app@sha256:…) the cache fetches before any node asks and keeps whatever their
	// ttl: what the cluster must be able to start cold, such as its own add-ons. Each must be
	// pulled through this mirror's host; one that is not is ignored and the Ready condition's
	// message says so.
	// +kubebuilder:validation:MaxItems=200
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.all(r, r.matches('^([A-Za-z0-9][-A-Za-z0-9.]*(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$'))",message="prefetch: each entry must be an image reference as a Pod names it: [host[:port]/]repository[:tag][@sha256:digest], the repository in lower case (e.g. docker.io/library/nginx:1.27)"
	// +listType=set
	// +optional
	Prefetch []string `json:"prefetch,omitempty"`

	// DeletionPolicy says what happens to the cache volumes when the mirror is deleted: Retain
	// keeps them (a mirror of the same name made later reuses them), Delete removes them.
	// +kubebuilder:validation:Enum=Retain;Delete
	// +kubebuilder:default=Retain
	// +optional
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`
}

// Storage is a cache pod's volume.
type Storage struct {
	// Size of each cache pod's volume.
	// +kubebuilder:default="20Gi"
	// +kubebuilder:validation:XValidation:rule="quantity(self).isGreaterThan(quantity('0'))",message="storage.size must be more than zero, e.g. 20Gi"
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// StorageClassName of the volumes; empty uses the cluster's default class.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`
}

// Eviction is a cache volume's marks, in percent of the volume.
// +kubebuilder:validation:XValidation:rule="!has(self.lowWaterPercent) || self.lowWaterPercent < self.highWaterPercent",message="eviction.lowWaterPercent must be below eviction.highWaterPercent: eviction deletes from the high-water mark down to the low one"
type Eviction struct {
	// HighWaterPercent of the volume used starts an eviction.
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=99
	// +kubebuilder:default=85
	// +optional
	HighWaterPercent int32 `json:"highWaterPercent,omitempty"`
	// LowWaterPercent of the volume used ends it. Default: ten points below highWaterPercent.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=98
	// +optional
	LowWaterPercent *int32 `json:"lowWaterPercent,omitempty"`
}

// DeletionPolicy is what happens to a mirror's cache volumes when it is deleted.
type DeletionPolicy string

// Deletion policies.
const (
	DeletionPolicyRetain DeletionPolicy = "Retain"
	DeletionPolicyDelete DeletionPolicy = "Delete"
)

// Condition types of a RegistryMirror (kstatus: Ready summarizes, Reconciling and Stalled qualify).
// Warmed, present while something is pinned, says whether the cache pods hold every pinned image;
// it never changes Ready (a mirror serves while it fetches).
const (
	ConditionReady       = "Ready"
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
	ConditionWarmed      = "Warmed"
)

// Reasons of the Warmed condition.
const (
	// ReasonWarmed: every ready cache pod read the current pins and holds what it owns of them.
	ReasonWarmed = "Warmed"
	// ReasonWarming: a cache pod fetches pinned images, or has not read the current pins yet.
	ReasonWarming = "Warming"
	// ReasonWarmFailed: a pinned image could not be fetched (the message names it and why); the
	// cache tries again every 5 minutes.
	ReasonWarmFailed = "WarmFailed"
	// ReasonNotReported: no ready cache pod noted its pins (none ready, or a cache of a release
	// that does not report).
	ReasonNotReported = "NotReported"
)

// ReasonDuplicateMirrorHost is the Ready reason of a mirror refused because an older mirror serves
// its host; its node agents read it to release their files.
const ReasonDuplicateMirrorHost = "DuplicateMirrorHost"

// RegistryMirrorStatus is what the operator last observed and did.
type RegistryMirrorStatus struct {
	// Endpoint is the address nodes pull through, e.g. http://10.96.0.12:5000.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// MirrorHost is the host name the nodes redirect to the mirror (spec.mirrorHost or its default).
	// +optional
	MirrorHost string `json:"mirrorHost,omitempty"`
	// ReadyReplicas is the number of cache pods ready to serve.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`
	// NodesConfigured is the number of nodes whose containerd uses the mirror.
	// +optional
	NodesConfigured int32 `json:"nodesConfigured"`
	// NodesDesired is the number of nodes the node agent should run on.
	// +optional
	NodesDesired int32 `json:"nodesDesired"`
	// PinnedImages is the number of images the cache keeps whatever their ttl: those a Pod or a
	// workload template names through the mirror's host, and those named within ttl.
	// +optional
	PinnedImages int32 `json:"pinnedImages"`
	// PinnedSize is what pinned content takes on the cache pod's volume that holds the most of
	// it (rounded up to a MiB), as the cache pods last reported it.
	// +optional
	PinnedSize *resource.Quantity `json:"pinnedSize,omitempty"`
	// Conditions: Ready, Reconciling, Stalled; Warmed while something is pinned.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the generation of the spec last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// RegistryMirror is an in-cluster pull-through cache of one upstream registry, used by every
// node's containerd before the upstream.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rm,categories=quartermaster
// +kubebuilder:printcolumn:name="Upstream",type=string,JSONPath=`.spec.upstreamUrl`
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.status.mirrorHost`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodesConfigured`
// +kubebuilder:printcolumn:name="Pinned",type=integer,JSONPath=`.status.pinnedImages`,priority=1
// +kubebuilder:printcolumn:name="Pinned-Size",type=string,JSONPath=`.status.pinnedSize`,priority=1
// +kubebuilder:printcolumn:name="Warmed",type=string,JSONPath=`.status.conditions[?(@.type=="Warmed")].reason`,priority=1
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// The name prefixes the cache's objects (mirror-<name>, a Service name), so it is a short DNS label;
// the suffixes of a mirror's other objects are refused, or mirror "a-agent" would collide with
// mirror "a"'s node agent.
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.metadata.name.size() <= 40",message="metadata.name must be a DNS label of at most 40 characters (lower case letters, digits and '-'): it names the mirror's Services and StatefulSet"
// +kubebuilder:validation:XValidation:rule="!self.metadata.name.endsWith('-headless') && !self.metadata.name.endsWith('-agent') && !self.metadata.name.endsWith('-cache')",message="metadata.name must not end in -headless, -agent or -cache: those name another mirror's objects"
type RegistryMirror struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec RegistryMirrorSpec `json:"spec"`
	// +optional
	Status RegistryMirrorStatus `json:"status,omitempty"`
}

// RegistryMirrorList is a list of RegistryMirrors.
// +kubebuilder:object:root=true
type RegistryMirrorList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RegistryMirror `json:"items"`
}
