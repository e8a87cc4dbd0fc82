package nodeagent

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/ownpod"
)

// Annotations the agent keeps on its own Pod: how the node it runs on is configured. The
// controller counts configured nodes from them.
const (
	// AnnotationHostsDir is the node directory containerd reads hosts.toml files from first,
	// where the agent writes, or "" when containerd reads none.
	AnnotationHostsDir = "registry.quartermaster.dev/containerd-hosts-dir"
	// AnnotationConfigured is "true" when the node's containerd pulls through the mirror: the
	// file is in place with the current content and containerd reads that directory.
	AnnotationConfigured = "registry.quartermaster.dev/node-configured"
	// AnnotationReason is a one-word reason for AnnotationConfigured (the Reason* constants).
	AnnotationReason = "registry.quartermaster.dev/node-configured-reason"
	// AnnotationMessage says the same for a person, with what to do.
	AnnotationMessage = "registry.quartermaster.dev/node-configured-message"
)

// MirrorResource is the RegistryMirror resource the agent reads.
var MirrorResource = registryv1alpha1.GroupVersion.WithResource("registrymirrors")

// Kube is the agent's access to the API server: reads of RegistryMirrors (RBAC: get
// registrymirrors) and patches of its own Pod (RBAC: patch pods in its namespace).
type Kube struct {
	// Mirrors reads whole RegistryMirrors, status included (metadata alone cannot say whether a
	// mirror still serves its host), as unstructured objects: an agent older or newer than the
	// CRD still reads the few fields it needs.
	Mirrors dynamic.ResourceInterface
	// Pod is the agent's own Pod, where it notes how the node is configured.
	*ownpod.Pod
}

// NewKube connects to the API server as cfg says, for the agent running as the named Pod.
func NewKube(cfg *rest.Config, podName, podNamespace string) (*Kube, error) {
	pod, err := ownpod.New(cfg, podName, podNamespace)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Kube{Mirrors: dyn.Resource(MirrorResource), Pod: pod}, nil
}

// MirrorState is what the API server says of a RegistryMirror, as far as one host's node files
// go: whether the mirror still serves that host.
type MirrorState int

// States of a RegistryMirror for one host. Every state but MirrorServes releases the host: the
// mirror's files there go at its agents' shutdown, and another mirror's agent may take them over.
const (
	// MirrorServes: it serves the host; keep its files.
	MirrorServes MirrorState = iota
	// MirrorDeleting: it has a deletionTimestamp.
	MirrorDeleting
	// MirrorGone: not found.
	MirrorGone
	// MirrorDuplicate: refused for the host (Ready reason DuplicateMirrorHost) because an older
	// mirror serves it; the controller says so before it deletes the mirror's node agents.
	MirrorDuplicate
	// MirrorMoved: its status.mirrorHost is another host.
	MirrorMoved
)

// Releases says whether the mirror no longer serves the host.
func (s MirrorState) Releases() bool { return s != MirrorServes }

func (s MirrorState) String() string {
	switch s {
	case MirrorServes:
		return "serves the host"
	case MirrorDeleting:
		return "is being deleted"
	case MirrorGone:
		return "is gone"
	case MirrorDuplicate:
		return "is refused for the host (" + registryv1alpha1.ReasonDuplicateMirrorHost + ")"
	case MirrorMoved:
		return "serves another host"
	}
	return fmt.Sprintf("MirrorState(%d)", int(s))
}

// Mirror reads the named RegistryMirror and says whether it serves host. Any error but NotFound
// (the API server unreachable, forbidden) is returned: the caller cannot tell, and keeps the
// files.
func (k *Kube) Mirror(ctx context.Context, name, host string) (MirrorState, error) {
	m, err := k.Mirrors.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return MirrorGone, nil
	case err != nil:
		return MirrorServes, err
	}
	return mirrorState(m, host), nil
}

// mirrorState reads m's deletion and status. A field missing or of another type counts as unset:
// a mirror the controller has not reconciled yet serves its host.
func mirrorState(m *unstructured.Unstructured, host string) MirrorState {
	if m.GetDeletionTimestamp() != nil {
		return MirrorDeleting
	}
	conditions, _, _ := unstructured.NestedSlice(m.Object, "status", "conditions")
	for _, c := range conditions {
		c, _ := c.(map[string]any)
		if c["type"] == registryv1alpha1.ConditionReady && c["reason"] == registryv1alpha1.ReasonDuplicateMirrorHost {
			return MirrorDuplicate
		}
	}
	if served, _, _ := unstructured.NestedString(m.Object, "status", "mirrorHost"); served != "" && served != host {
		return MirrorMoved
	}
	return MirrorServes
}
