package v1alpha1

// Impact states.
const (
	// ImpactCurrent: counted from the engine's own reports of its scans, kept current as they change.
	ImpactCurrent = "Current"
	// ImpactUnknown: the engine's reports cannot be read now (its reports controller is not
	// running, or its report kinds are not installed); the message says which. Violations is
	// left out: unknown is not zero.
	ImpactUnknown = "Unknown"
	// ImpactNotScanned: no engine that enforces these intents scans existing workloads
	// (KubeArmor and NetworkPolicy act on what runs from now on and report nothing about it).
	ImpactNotScanned = "NotScanned"
)

// MaxImpactedWorkloads is how many violating workloads an impact names.
const MaxImpactedWorkloads = 10

// Impact is what the policy engines' scans of existing workloads found against the policies
// generated for an intent or a binding: for an Audit intent its result, for a Block intent what
// was admitted before it took effect. Quartermaster's own addition to Nimbus's status.
type Impact struct {
	// State is Current, Unknown or NotScanned.
	// +kubebuilder:validation:Enum=Current;Unknown;NotScanned
	State string `json:"state"`
	// Violations counts the existing workloads that fail at least one of the policies (Current
	// only).
	// +optional
	Violations *int32 `json:"violations,omitempty"`
	// Scanned counts the workloads the engine has checked against the policies so far (Current
	// only): a scan in progress shows as fewer than the workloads the policies select.
	// +optional
	Scanned *int32 `json:"scanned,omitempty"`
	// Violating names the first violating workloads, sorted by namespace, kind and name (at most
	// ten; Violations counts them all).
	// +kubebuilder:validation:MaxItems=10
	// +optional
	Violating []ImpactedWorkload `json:"violating,omitempty"`
	// Unreported are the scanned policies no report names yet (Current only): Kyverno's background
	// scan has not reached them, or they select nothing. Until it has, their violations are not
	// counted.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Unreported []string `json:"unreported,omitempty"`
	// Message says where the figures come from, or why they are unknown.
	// +optional
	Message string `json:"message,omitempty"`
}

// ImpactedWorkload is one existing workload an engine found violating a policy.
type ImpactedWorkload struct {
	// +optional
	Namespace string `json:"namespace,omitempty"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	// Policy is the engine policy it fails (Kind/name, as status.adapterPolicies lists it).
	// +optional
	Policy string `json:"policy,omitempty"`
	// Message is the engine's own message for the failed rule, cut at 256 characters.
	// +optional
	Message string `json:"message,omitempty"`
}
