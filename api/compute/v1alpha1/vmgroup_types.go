package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// VmGroupSpec is the group a user asks for: how many VMs, their size and the template they are
// cloned from.
// +kubebuilder:validation:XValidation:rule="has(self.placement) == has(oldSelf.placement) || has(self.placement) && (!has(self.placement.datacenter) && !has(self.placement.folder) && !has(self.placement.resourcePool) && !has(self.placement.datastore) && !has(self.placement.network)) || has(oldSelf.placement) && (!has(oldSelf.placement.datacenter) && !has(oldSelf.placement.folder) && !has(oldSelf.placement.resourcePool) && !has(oldSelf.placement.datastore) && !has(oldSelf.placement.network))",message="placement is immutable but for antiAffinity: existing VMs are not moved; create a new VmGroup to place VMs elsewhere"
// +kubebuilder:validation:XValidation:rule="!has(self.snapshot) || (has(self.cloneMode) && self.cloneMode == 'Linked')",message="snapshot names what linked clones are made from: set cloneMode: Linked, or remove snapshot"
// +kubebuilder:validation:XValidation:rule="!has(self.addressPool) || !has(self.addressPool.addresses) || !has(self.replicas) || self.addressPool.addresses.exists(a, a.contains('-')) || size(self.addressPool.addresses) >= self.replicas",message="spec.replicas is more than addressPool.addresses lists: each VM needs an address of its own"
type VmGroupSpec struct {
	// CPU is the number of virtual CPUs of each VM.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4
	// +required
	CPU int32 `json:"cpu"`

	// Memory is the memory of each VM in GB.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	// +required
	Memory int32 `json:"memory"`

	// Template is the VM template the VMs are cloned from: an inventory path ("/DC0/vm/templates/ubuntu")
	// or a name found in the datacenter. Changing it replaces the VMs one at a time.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self == self.trim()",message="template must not start or end with spaces"
	// +required
	Template string `json:"template"`

	// CloneMode is how a VM is cloned from the template: Full (also when empty) copies its disks;
	// Linked makes the VM's disks children of a snapshot of the template's (spec.snapshot, or the
	// template's current snapshot): no copy, so seconds and a fraction of the storage, and vCenter
	// counts it as a quarter of a full clone's work. The snapshot must stay while linked VMs use
	// it. A change applies to the VMs cloned from then on. (No default is written: the VmGroups
	// stored before the field existed read back as they were stored.)
	// +kubebuilder:validation:Enum=Full;Linked
	// +optional
	CloneMode CloneMode `json:"cloneMode,omitempty"`

	// Snapshot names the template's snapshot linked clones are made from (cloneMode Linked); empty:
	// the template's current snapshot.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +optional
	Snapshot string `json:"snapshot,omitempty"`

	// Replicas is the number of VMs. Scale down removes the highest ordinals first. At most 1000
	// here; the operator's --vsphere-max-replicas (default 100) may allow fewer.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=1
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Readiness says when a VM counts as ready: GuestIP (default) once it is powered on and VMware
	// Tools report an IP address of its guest; PowerState as soon as it is powered on (guests
	// without VMware Tools).
	// +kubebuilder:validation:Enum=GuestIP;PowerState
	// +kubebuilder:default=GuestIP
	// +optional
	Readiness Readiness `json:"readiness,omitempty"`

	// ShutdownTimeout is how long a VM's guest gets to shut down (asked through VMware Tools) before
	// it is powered off hard, when the VM is removed or reconfigured. VMs without running VMware
	// Tools, and a timeout of 0s, are powered off at once.
	// +kubebuilder:default="60s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('1h')",message="shutdownTimeout must be between 0s and 1h"
	// +optional
	ShutdownTimeout *metav1.Duration `json:"shutdownTimeout,omitempty"`

	// UserData is the cloud-init user data each VM gets at first boot (guestinfo.userdata), from a
	// Secret in the VmGroup's namespace. Changing it (or the Secret's data) replaces the VMs one at
	// a time.
	// +optional
	UserData *UserDataSource `json:"userData,omitempty"`

	// Metadata is cloud-init metadata each VM gets at first boot (guestinfo.metadata), as an object
	// (network configuration, say); instance-id and local-hostname are set to the VM's name.
	// Changing it replaces the VMs one at a time.
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	// +optional
	Metadata *runtime.RawExtension `json:"metadata,omitempty"`

	// Placement says where in vCenter the VMs go; each field left empty takes the operator's
	// default (its --vsphere-* flags). Immutable, but for antiAffinity.
	// +optional
	Placement *Placement `json:"placement,omitempty"`

	// Disks are data disks each VM gets beside its template's, thin-provisioned, on the SCSI
	// controller of the template's first disk. A larger size grows a disk in place (the VMs are
	// reconfigured one at a time); a smaller one is refused. Adding, removing or renaming a disk,
	// or changing its datastore, replaces the VMs one at a time (a VM's data disks go with it).
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	// +optional
	Disks []DataDisk `json:"disks,omitempty"`

	// AddressPool gives each VM a static IPv4 address of its own, for networks without DHCP: the
	// address, prefix, gateway and name servers reach the guest's first network adapter (matched by
	// its MAC address) through cloud-init's network configuration in guestinfo.metadata. Each
	// address is given to one VM at a time, across every group of the operator; it is recorded in
	// status.addresses before the VM is cloned and released when the VM is removed. Changing the
	// network, gateway or name servers replaces the VMs one at a time; removing an address from the
	// pool does not take it from the VM that has it.
	// +optional
	AddressPool *AddressPool `json:"addressPool,omitempty"`
}

// DataDisk is a data disk of each VM of the group.
// +kubebuilder:validation:XValidation:rule="self.sizeGiB >= oldSelf.sizeGiB",message="a data disk cannot shrink: its file system would lose data; grow it, or replace the VMs by renaming the disk"
// +kubebuilder:validation:XValidation:rule="has(self.datastore) == has(oldSelf.datastore) && (!has(self.datastore) || self.datastore == oldSelf.datastore)",message="a data disk's datastore is fixed: rename the disk to move the VMs' disks (the VMs are replaced)"
type DataDisk struct {
	// Name identifies the disk in the spec (a DNS label); the guest sees the disks in order.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`
	// SizeGiB is the disk's size in GiB.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16384
	// +required
	SizeGiB int32 `json:"sizeGiB"`
	// Datastore is the datastore (name or inventory path) of the disk's file; empty: the VM's.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Datastore string `json:"datastore,omitempty"`
}

// AddressPool is where a group's static addresses come from.
// +kubebuilder:validation:XValidation:rule="!has(self.addresses) || !has(self.gateway) || !(self.gateway in self.addresses)",message="the gateway cannot be in the pool's addresses"
type AddressPool struct {
	// Network is the subnet the VMs' addresses are in, as a CIDR ("10.20.0.0/24"); each VM gets its
	// prefix length.
	// +kubebuilder:validation:MaxLength=18
	// +kubebuilder:validation:Pattern=`^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$`
	// +required
	Network string `json:"network"`

	// Addresses are the ones to hand out, each an address ("10.20.0.11") or an inclusive range
	// ("10.20.0.20-10.20.0.40"), all within network. Empty: every address of the network but its
	// first (the network's own), its last (broadcast) and the gateway.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=31
	// +kubebuilder:validation:items:Pattern=`^([0-9]{1,3}\.){3}[0-9]{1,3}(-([0-9]{1,3}\.){3}[0-9]{1,3})?$`
	// +listType=atomic
	// +optional
	Addresses []string `json:"addresses,omitempty"`

	// Gateway is the default route's next hop, within network; empty: no default route.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^([0-9]{1,3}\.){3}[0-9]{1,3}$`
	// +optional
	Gateway string `json:"gateway,omitempty"`

	// Nameservers are the DNS servers the guests use.
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:MaxLength=15
	// +kubebuilder:validation:items:Pattern=`^([0-9]{1,3}\.){3}[0-9]{1,3}$`
	// +listType=atomic
	// +optional
	Nameservers []string `json:"nameservers,omitempty"`
}

// AddressAllocation is a static address recorded for a VM of the group.
type AddressAllocation struct {
	// VM is the VM's name.
	VM string `json:"vm"`
	// Address is its address, with the network's prefix length ("10.20.0.11/24").
	Address string `json:"address"`
}

// CloneMode is how a VM is cloned from the template.
type CloneMode string

// Clone modes.
const (
	CloneModeFull   CloneMode = "Full"
	CloneModeLinked CloneMode = "Linked"
)

// Readiness is when a VM counts as ready.
type Readiness string

// Readiness values.
const (
	ReadinessGuestIP    Readiness = "GuestIP"
	ReadinessPowerState Readiness = "PowerState"
)

// AnnotationDeleteFirst is the VmGroup annotation naming the member VMs to remove first when it scales in
// (comma-separated VM names, e.g. "web-3,web-1"; as Cluster API's delete-machine annotation does for
// its Machines): annotate, then `kubectl scale`. Without it, or for the rest, the highest ordinals
// go first. A name that is no member is ignored, and said in a Warning Event at the scale-in.
const AnnotationDeleteFirst = "compute.quartermaster.dev/delete-first"

// DefaultUserDataKey is the Secret key of the user data when spec.userData.key is empty.
const DefaultUserDataKey = "userData"

// UserDataSource names the Secret key holding cloud-init user data.
type UserDataSource struct {
	// SecretName is the Secret's name, in the VmGroup's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	SecretName string `json:"secretName"`
	// Key is the Secret's key holding the user data; default userData.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Key string `json:"key,omitempty"`
}

// Placement locates the group's VMs in vCenter.
// +kubebuilder:validation:XValidation:rule="has(self.datacenter) == has(oldSelf.datacenter) && (!has(self.datacenter) || self.datacenter == oldSelf.datacenter) && has(self.folder) == has(oldSelf.folder) && (!has(self.folder) || self.folder == oldSelf.folder) && has(self.resourcePool) == has(oldSelf.resourcePool) && (!has(self.resourcePool) || self.resourcePool == oldSelf.resourcePool) && has(self.datastore) == has(oldSelf.datastore) && (!has(self.datastore) || self.datastore == oldSelf.datastore) && has(self.network) == has(oldSelf.network) && (!has(self.network) || self.network == oldSelf.network)",message="placement is immutable but for antiAffinity: existing VMs are not moved; create a new VmGroup to place VMs elsewhere"
type Placement struct {
	// Datacenter is the datacenter's name.
	// +kubebuilder:validation:MaxLength=255
	// +optional
	Datacenter string `json:"datacenter,omitempty"`

	// Folder is the parent of the group's own folder: an inventory path ("/DC0/vm/teams") or a path
	// relative to the datacenter's VM folder ("teams").
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Folder string `json:"folder,omitempty"`

	// ResourcePool is the resource pool's inventory path or name.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	ResourcePool string `json:"resourcePool,omitempty"`

	// Datastore is the datastore's name or inventory path; empty keeps the template's.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Datastore string `json:"datastore,omitempty"`

	// Network is the network (port group) of each VM's first network adapter; empty keeps the
	// template's.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Network string `json:"network,omitempty"`

	// AntiAffinity keeps the group's VMs on separate ESXi hosts, so one host's failure takes down
	// one member at most: a DRS VM-VM anti-affinity rule of the resource pool's cluster holds the
	// group's VMs, each joining it before it first powers on. Required: vCenter keeps a VM powered
	// off rather than put it beside another member (with fewer usable hosts than replicas, the
	// members left over are reported, not run); Preferred: DRS keeps them apart while it can.
	// Empty: no rule. It may be changed at any time (the rule follows; vCenter's DRS moves running
	// VMs to comply). Needs a cluster with DRS on.
	// +kubebuilder:validation:Enum=Required;Preferred
	// +optional
	AntiAffinity AntiAffinity `json:"antiAffinity,omitempty"`
}

// AntiAffinity is how strictly a group's VMs are kept on separate hosts.
type AntiAffinity string

// Anti-affinity values.
const (
	AntiAffinityRequired  AntiAffinity = "Required"
	AntiAffinityPreferred AntiAffinity = "Preferred"
)

// Phase summarizes a VmGroup's state in one word.
// +kubebuilder:validation:Enum=Pending;Running;Error;Deleting
type Phase string

// Phases of a VmGroup.
const (
	// PhasePending: the group is being brought to its spec, or vCenter cannot be reached.
	PhasePending Phase = "Pending"
	// PhaseRunning: every VM exists, is powered on and matches the spec.
	PhaseRunning Phase = "Running"
	// PhaseError: the group cannot progress until something changes (e.g. the template is missing).
	PhaseError Phase = "Error"
	// PhaseDeleting: the group's VMs and folder are being removed.
	PhaseDeleting Phase = "Deleting"
)

// Condition types of a VmGroup (kstatus: Ready summarizes, Reconciling and Stalled qualify).
const (
	ConditionReady       = "Ready"
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
)

// VMStatus is one VM of the group as last observed.
type VMStatus struct {
	// Name is the VM's name, <group name>-<ordinal>.
	Name string `json:"name"`
	// PowerState is vCenter's: poweredOn, poweredOff or suspended.
	// +optional
	PowerState string `json:"powerState,omitempty"`
	// IP is the guest's primary IP address, when VMware Tools report one.
	// +optional
	IP string `json:"ip,omitempty"`
	// IPAddresses are every address of the guest's network adapters, as VMware Tools report them.
	// +optional
	// +listType=atomic
	IPAddresses []string `json:"ipAddresses,omitempty"`
	// Ready is true when the VM is powered on and, unless spec.readiness is PowerState, its guest
	// reports an IP address.
	Ready bool `json:"ready"`
}

// VmGroupStatus is what the operator last observed and did.
type VmGroupStatus struct {
	// Phase is Pending, Running, Error or Deleting.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// CurrentReplicas is the number of the group's VMs that exist.
	// +optional
	CurrentReplicas int32 `json:"currentReplicas"`
	// ReadyReplicas is the number of the group's VMs that are ready (see spec.readiness).
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`
	// Ready is readyReplicas/replicas, for kubectl get.
	// +optional
	Ready string `json:"ready,omitempty"`
	// DesiredReplicas is spec.replicas as last seen.
	// +optional
	DesiredReplicas int32 `json:"desiredReplicas"`
	// LastMessage says what happened last, or what is wrong.
	// +optional
	LastMessage string `json:"lastMessage,omitempty"`
	// VMs lists the group's VMs by ordinal.
	// +optional
	// +listType=map
	// +listMapKey=name
	VMs []VMStatus `json:"vms,omitempty"`
	// UnmanagedVMs lists VMs found in the group's folder that Quartermaster did not create; they are
	// reported and left alone.
	// +optional
	// +listType=set
	UnmanagedVMs []string `json:"unmanagedVMs,omitempty"`
	// Folder is the inventory path of the group's folder, recorded when it is created so the VMs are
	// found (and cleaned up) even if the operator's defaults change later.
	// +optional
	Folder string `json:"folder,omitempty"`
	// Addresses are the static addresses of spec.addressPool given to the group's VMs, recorded
	// before each VM is cloned: a VM re-created under its name gets its address again; an address is
	// released when its VM is removed.
	// +optional
	// +listType=map
	// +listMapKey=vm
	Addresses []AddressAllocation `json:"addresses,omitempty"`
	// AntiAffinityRule names the DRS rule (in the cluster of the group's resource pool) that keeps
	// the group's VMs on separate hosts, while there is one.
	// +optional
	AntiAffinityRule string `json:"antiAffinityRule,omitempty"`
	// Selector is the label selector of the scale subresource (for kubectl scale and HPA).
	// +optional
	Selector string `json:"selector,omitempty"`
	// Conditions: Ready, Reconciling, Stalled.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the generation of the spec last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// VmGroup is a group of vSphere VMs cloned from a template, scalable with kubectl scale.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.currentReplicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=vg,categories=quartermaster
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.currentReplicas`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="CPU",type=integer,JSONPath=`.spec.cpu`
// +kubebuilder:printcolumn:name="Memory",type=integer,JSONPath=`.spec.memory`,description="GB"
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.template`
// +kubebuilder:printcolumn:name="Last_Message",type=string,JSONPath=`.status.lastMessage`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// The name becomes the VMs' names (<name>-<ordinal>), which guests commonly use as host names.
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.metadata.name.size() <= 50",message="metadata.name must be a DNS label of at most 50 characters (lower case letters, digits and '-'): it names the VMs <name>-<ordinal>"
type VmGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec VmGroupSpec `json:"spec"`
	// +optional
	Status VmGroupStatus `json:"status,omitempty"`
}

// VmGroupList is a list of VmGroups.
// +kubebuilder:object:root=true
type VmGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VmGroup `json:"items"`
}
