package mirror

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
)

// Labels and annotations on a mirror's objects.
const (
	// LabelMirror names the RegistryMirror an object belongs to; the controller's cache holds
	// only objects that carry it.
	LabelMirror = "registry.quartermaster.dev/mirror"
	// LabelComponent is "cache" or "node-agent".
	LabelComponent = "app.kubernetes.io/component"
	// AnnotationConfigHash on the cache's pod template is the hash of the cache Secret's data:
	// a new configuration or rotated credentials roll the StatefulSet.
	AnnotationConfigHash = "registry.quartermaster.dev/config-hash"
)

// Components of a mirror.
const (
	ComponentCache = "cache"
	ComponentAgent = "node-agent"
)

// The node agent's side of the DaemonSet contract (see cmd/quartermaster/nodeagent.go).
const (
	AgentProbePort = 8081
	// HostRoot is where the agent sees the node's filesystem; only ContainerdDir is mounted.
	HostRoot      = "/host"
	ContainerdDir = "/etc/containerd"
	// CertsDir is containerd's default hosts directory, the only one the agent can write.
	CertsDir = "/etc/containerd/certs.d"
)

// cacheVolume is the volume claim template's name: PVCs are cache-mirror-<name>-<ordinal>.
const cacheVolume = "cache"

// Install is what the operator's deployment decides for every mirror.
type Install struct {
	// Namespace holds every mirror's objects (--mirrors-namespace).
	Namespace string
	// Image is Quartermaster's own image: the cache and the node agent are its subcommands.
	Image string
	// AgentServiceAccount is the node agent's ServiceAccount (installed with the operator).
	AgentServiceAccount string
	// CacheServiceAccount, when set, is the cache pods' ServiceAccount (installed with the
	// operator): they note their pins' state on their own Pods (AnnotationCacheReport), which is
	// all its token may do. Without one a cache has no API token and reports nothing.
	CacheServiceAccount string
	// PrepareStorage gives each cache pod the init container StorageInit: volumes whose
	// provisioner ignores fsGroup arrive owned by root, and the non-root cache could not write them.
	PrepareStorage bool
}

// CacheName names a mirror's StatefulSet, its Service (the one nodes reach) and its
// PodDisruptionBudget.
func CacheName(mirror string) string { return "mirror-" + mirror }

// HeadlessName names the StatefulSet's governing Service.
func HeadlessName(mirror string) string { return CacheName(mirror) + "-headless" }

// SecretName names the Secret holding the cache's configuration and upstream credentials.
func SecretName(mirror string) string { return CacheName(mirror) + "-cache" }

// AgentName names the node agent's DaemonSet.
func AgentName(mirror string) string { return CacheName(mirror) + "-agent" }

// PVCName names cache pod ordinal's volume, as the StatefulSet controller makes it.
func PVCName(mirror string, ordinal int) string {
	return cacheVolume + "-" + CacheName(mirror) + "-" + strconv.Itoa(ordinal)
}

// Labels are the labels of a mirror's objects of one component.
func Labels(mirror, component string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "registry-mirror",
		"app.kubernetes.io/instance":   mirror,
		"app.kubernetes.io/managed-by": "quartermaster",
		LabelComponent:                 component,
		LabelMirror:                    mirror,
	}
}

func selector(mirror, component string) map[string]string {
	return map[string]string{LabelMirror: mirror, LabelComponent: component}
}

func objectMeta(in Install, name, mirror, component string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: in.Namespace, Labels: Labels(mirror, component)}
}

// Credentials are the upstream's, as read from the user's Secret.
type Credentials struct {
	Username, Password string
}

// CacheSecret is the cache's configuration and, when the upstream needs them, its credentials:
// one Secret mounted at ConfigDir.
func CacheSecret(in Install, s Spec, config []byte, creds *Credentials) *corev1.Secret {
	data := map[string][]byte{ConfigFile: config}
	if creds != nil {
		data[UsernameKey] = []byte(creds.Username)
		data[PasswordKey] = []byte(creds.Password)
	}
	return &corev1.Secret{
		ObjectMeta: objectMeta(in, SecretName(s.Name), s.Name, ComponentCache),
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
}

// ConfigHash is a hash of a Secret's data, for the pod template annotation that rolls the cache
// when the configuration or the credentials change.
func ConfigHash(data map[string][]byte) string {
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s%d:", len(k), k, len(data[k]))
		h.Write(data[k])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// HeadlessService governs the StatefulSet, exposes each pod's metrics port for scraping, and
// lists the ready pods' peer ports for each other (SRV records of the port named "peer").
func HeadlessService(in Install, s Spec) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: objectMeta(in, HeadlessName(s.Name), s.Name, ComponentCache),
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  selector(s.Name, ComponentCache),
			Ports: []corev1.ServicePort{
				{Name: "registry", Port: CachePort, TargetPort: intstr.FromString("registry"), Protocol: corev1.ProtocolTCP},
				{Name: "metrics", Port: MetricsPort, TargetPort: intstr.FromString("metrics"), Protocol: corev1.ProtocolTCP},
				{Name: PeerPortName, Port: PeerPort, TargetPort: intstr.FromString(PeerPortName), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// PeersService is the DNS name the cache pods find each other at: the headless Service in the
// pods' own cluster domain (resolved through their search path).
func PeersService(in Install, mirror string) string {
	return HeadlessName(mirror) + "." + in.Namespace + ".svc"
}

// Service is what the nodes' containerd reaches the cache at.
func Service(in Install, s Spec) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: objectMeta(in, CacheName(s.Name), s.Name, ComponentCache),
		Spec: corev1.ServiceSpec{
			Type:     s.ServiceType,
			Selector: selector(s.Name, ComponentCache),
			Ports: []corev1.ServicePort{
				{Name: "registry", Port: CachePort, TargetPort: intstr.FromString("registry"), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// Endpoint is the address nodes pull through, from the Service as the API server returned it
// (its cluster IP or node port), or "" while it has none.
func Endpoint(svc *corev1.Service) string {
	if svc.Spec.Type == corev1.ServiceTypeNodePort {
		for _, p := range svc.Spec.Ports {
			if p.Name == "registry" && p.NodePort != 0 {
				// kube-proxy answers node ports on the node's loopback too: the node's own
				// containerd needs no knowledge of its addresses.
				return "http://127.0.0.1:" + strconv.Itoa(int(p.NodePort))
			}
		}
		return ""
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return ""
	}
	return "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(CachePort))
}

// StatefulSet runs the cache pods; configHash is ConfigHash of the cache Secret's data.
func StatefulSet(in Install, s Spec, configHash string) *appsv1.StatefulSet {
	retain := appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	whenDeleted := retain
	if s.DeletionPolicy == registryv1alpha1.DeletionPolicyDelete {
		whenDeleted = appsv1.DeletePersistentVolumeClaimRetentionPolicyType
	}
	labels := Labels(s.Name, ComponentCache)
	return &appsv1.StatefulSet{
		ObjectMeta: objectMeta(in, CacheName(s.Name), s.Name, ComponentCache),
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To(s.Replicas),
			ServiceName: HeadlessName(s.Name),
			Selector:    &metav1.LabelSelector{MatchLabels: selector(s.Name, ComponentCache)},
			// Start and replace the caches all at once: a pod missing from the peers only moves
			// its digests to the others (docs/mirrors.md, Replicas).
			PodManagementPolicy: appsv1.ParallelPodManagement,
			UpdateStrategy:      appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType},
			// Scaling down keeps the volumes (scaling up again finds a warm cache); deleting the
			// mirror follows its deletionPolicy.
			PersistentVolumeClaimRetentionPolicy: &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
				WhenDeleted: whenDeleted, WhenScaled: retain,
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{AnnotationConfigHash: configHash}},
				Spec:       cachePod(in, s),
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: cacheVolume, Labels: Labels(s.Name, ComponentCache)},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: s.StorageClassName,
					Resources: corev1.VolumeResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceStorage: s.StorageSize},
					},
				},
			}},
		},
	}
}

const nonRoot = 65532 // distroless's nonroot user

// StorageInit names the cache pod's init container that prepares its volume (Install.PrepareStorage).
const StorageInit = "storage"

// storageInit makes a fresh cache volume writable by the cache (quartermaster cache-storage): the
// only container of the mirrors that runs as root, with CAP_CHOWN alone, a read-only root and no
// API token, changing the owner of the empty volume's root directory and nothing else.
func storageInit(in Install) corev1.Container {
	sc := restricted()
	sc.RunAsUser, sc.RunAsNonRoot = ptr.To[int64](0), ptr.To(false)
	sc.Capabilities.Add = []corev1.Capability{"CHOWN"}
	return corev1.Container{
		Name:  StorageInit,
		Image: in.Image,
		Args:  []string{"cache-storage", "--dir=" + StorageDir, "--owner=" + strconv.Itoa(nonRoot) + ":" + strconv.Itoa(nonRoot)},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		VolumeMounts:    []corev1.VolumeMount{{Name: cacheVolume, MountPath: StorageDir}},
		SecurityContext: sc,
	}
}

func cachePod(in Install, s Spec) corev1.PodSpec {
	probe := func(path string, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("registry")}},
			PeriodSeconds:    10,
			TimeoutSeconds:   2,
			SuccessThreshold: 1,
			FailureThreshold: failures,
		}
	}
	spec := corev1.PodSpec{
		// The cache talks to the upstream, and to the API server only to note on its own Pod what
		// it holds of the pins (its ServiceAccount may do nothing else): its container alone mounts
		// the token (apiToken), never the storage init container.
		AutomountServiceAccountToken: ptr.To(false),
		ServiceAccountName:           in.CacheServiceAccount,
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](nonRoot), RunAsGroup: ptr.To[int64](nonRoot),
			FSGroup:        ptr.To[int64](nonRoot),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		// Spread the caches over nodes, so one node going down leaves the others serving.
		TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.ScheduleAnyway,
			LabelSelector: &metav1.LabelSelector{MatchLabels: selector(s.Name, ComponentCache)},
		}},
		Containers: []corev1.Container{{
			Name:  "cache",
			Image: in.Image,
			Args: []string{
				"registry-mirror", "--config=" + ConfigDir + "/" + ConfigFile, "--credentials-dir=" + ConfigDir,
				"--peers-service=" + PeersService(in, s.Name), "--peer-name=$(POD_NAME)",
				"--pins=" + PinsDir + "/" + PinsFile,
			},
			// The pod's name is its name among the peers: the SRV records name it.
			Env: []corev1.EnvVar{fieldEnv("POD_NAME", "metadata.name")},
			Ports: []corev1.ContainerPort{
				{Name: "registry", ContainerPort: CachePort, Protocol: corev1.ProtocolTCP},
				{Name: "metrics", ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP},
				{Name: PeerPortName, ContainerPort: PeerPort, Protocol: corev1.ProtocolTCP},
			},
			ReadinessProbe: probe(ReadyPath, 3),
			LivenessProbe:  probe(LivePath, 6),
			Resources:      s.Resources,
			VolumeMounts: []corev1.VolumeMount{
				{Name: cacheVolume, MountPath: StorageDir},
				{Name: "config", MountPath: ConfigDir, ReadOnly: true},
				{Name: "pins", MountPath: PinsDir, ReadOnly: true},
			},
			SecurityContext: restricted(),
		}},
		Volumes: []corev1.Volume{{
			Name: "config",
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: SecretName(s.Name), DefaultMode: ptr.To[int32](0o440),
			}},
		}, {
			// The kubelet updates it in place (the cache reads it again); optional, so that a pod
			// starts before the controller wrote it, or with pinning off.
			Name: "pins",
			VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: PinsName(s.Name)},
				DefaultMode:          ptr.To[int32](0o444), Optional: ptr.To(true),
			}},
		}},
	}
	if in.PrepareStorage {
		spec.InitContainers = []corev1.Container{storageInit(in)}
	}
	if in.CacheServiceAccount != "" {
		c := &spec.Containers[0]
		c.Args = append(c.Args, "--report-to-pod")
		c.Env = append(c.Env, fieldEnv("POD_NAMESPACE", "metadata.namespace"))
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: apiTokenVolume, MountPath: APITokenDir, ReadOnly: true})
		spec.Volumes = append(spec.Volumes, apiToken())
	}
	return spec
}

// APITokenDir is where a client finds its Pod's ServiceAccount token, the cluster's CA and its
// namespace (rest.InClusterConfig); apiTokenVolume is the cache container's own mount of them.
const (
	APITokenDir    = "/var/run/secrets/kubernetes.io/serviceaccount"
	apiTokenVolume = "api-token"
)

// apiToken is the projected volume the kubelet mounts for an automounted token (a bound token it
// renews, the cluster's CA, the namespace), made explicit so that one container alone mounts it.
func apiToken() corev1.Volume {
	return corev1.Volume{Name: apiTokenVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o444),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
				Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}}}
}

func restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// PodDisruptionBudget lets a drain take one cache pod at a time.
func PodDisruptionBudget(in Install, s Spec) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: objectMeta(in, CacheName(s.Name), s.Name, ComponentCache),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			Selector:       &metav1.LabelSelector{MatchLabels: selector(s.Name, ComponentCache)},
		},
	}
}

// AgentDaemonSet runs the node agent on every node the mirror applies to; endpoint is the
// Service's Endpoint.
func AgentDaemonSet(in Install, s Spec, endpoint string) *appsv1.DaemonSet {
	// containerd's directory must exist (a node without containerd runs no agent), and is read
	// only: the agent reads config.toml and writes only under certs.d.
	mustExist, orCreate := corev1.HostPathDirectory, corev1.HostPathDirectoryOrCreate
	return &appsv1.DaemonSet{
		ObjectMeta: objectMeta(in, AgentName(s.Name), s.Name, ComponentAgent),
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: selector(s.Name, ComponentAgent)},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{
				Type:          appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptr.To(intstr.FromString("20%"))},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: Labels(s.Name, ComponentAgent)},
				Spec: corev1.PodSpec{
					ServiceAccountName: in.AgentServiceAccount,
					NodeSelector:       s.NodeSelector,
					Tolerations:        s.Tolerations,
					// Long enough to read the mirror once more and remove its file when the
					// mirror is being deleted.
					TerminationGracePeriodSeconds: ptr.To[int64](30),
					SecurityContext: &corev1.PodSecurityContext{
						// Root only to write the node's /etc/containerd/certs.d; no capability.
						RunAsUser:      ptr.To[int64](0),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:  "agent",
						Image: in.Image,
						Args: []string{
							"node-agent",
							"--mirror=" + s.Name,
							"--mirror-host=" + s.MirrorHost,
							"--endpoint=" + endpoint,
							"--upstream=" + s.UpstreamURL,
							"--root=" + HostRoot,
							"--probe-address=:" + strconv.Itoa(AgentProbePort),
						},
						Env: []corev1.EnvVar{
							fieldEnv("POD_NAME", "metadata.name"),
							fieldEnv("POD_NAMESPACE", "metadata.namespace"),
							fieldEnv("NODE_NAME", "spec.nodeName"),
						},
						Ports:          []corev1.ContainerPort{{Name: "probe", ContainerPort: AgentProbePort, Protocol: corev1.ProtocolTCP}},
						ReadinessProbe: agentProbe("/readyz", 10),
						LivenessProbe:  agentProbe("/healthz", 20),
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("24Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
						},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "containerd", MountPath: HostRoot + ContainerdDir, ReadOnly: true},
							{Name: "certs", MountPath: HostRoot + CertsDir},
						},
						SecurityContext: restricted(),
					}},
					Volumes: []corev1.Volume{
						{Name: "containerd", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: ContainerdDir, Type: &mustExist}}},
						{Name: "certs", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: CertsDir, Type: &orCreate}}},
					},
				},
			},
		},
	}
}

// agentProbe spells out every field the API server would default, so a comparison with the
// stored DaemonSet sees no difference.
func agentProbe(path string, period int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("probe")}},
		PeriodSeconds: period, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3,
	}
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}
