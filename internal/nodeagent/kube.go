package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
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

// MirrorResource is the RegistryMirror resource the agent reads (metadata only).
var MirrorResource = registryv1alpha1.GroupVersion.WithResource("registrymirrors")

// Kube is the agent's access to the API server: a metadata-only read of RegistryMirrors (RBAC:
// get registrymirrors) and patches of its own Pod (RBAC: patch pods in its namespace).
type Kube struct {
	Mirrors      metadata.Getter
	Pods         corev1client.PodInterface
	PodName      string
	PodNamespace string
}

// NewKube connects to the API server as cfg says, for the agent running as the named Pod.
func NewKube(cfg *rest.Config, podName, podNamespace string) (*Kube, error) {
	if podName == "" || podNamespace == "" {
		return nil, fmt.Errorf("the agent's Pod name and namespace are required (POD_NAME and POD_NAMESPACE from the downward API)")
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Kube{
		Mirrors:      md.Resource(MirrorResource),
		Pods:         core.Pods(podNamespace),
		PodName:      podName,
		PodNamespace: podNamespace,
	}, nil
}

// MirrorState is what the API server says of a RegistryMirror.
type MirrorState int

// States of a RegistryMirror, as far as its node files go.
const (
	// MirrorExists: keep its files.
	MirrorExists MirrorState = iota
	// MirrorDeleting: it has a deletionTimestamp; its files go.
	MirrorDeleting
	// MirrorGone: not found; its files go.
	MirrorGone
)

// Mirror reads the named RegistryMirror's metadata. Any error but NotFound (the API server
// unreachable, forbidden) is returned: the caller cannot tell, and keeps the files.
func (k *Kube) Mirror(ctx context.Context, name string) (MirrorState, error) {
	m, err := k.Mirrors.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return MirrorGone, nil
	case err != nil:
		return MirrorExists, err
	case m.DeletionTimestamp != nil:
		return MirrorDeleting, nil
	}
	return MirrorExists, nil
}

// Annotate merges annotations into the agent's Pod.
func (k *Kube) Annotate(ctx context.Context, annotations map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	_, err = k.Pods.Patch(ctx, k.PodName, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
