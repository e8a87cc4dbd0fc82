// Package ownpod is how a component the mirrors controller runs (a node agent, a cache pod) tells
// the controller what it alone can see: it merges annotations under registry.quartermaster.dev/
// into its own Pod, which the controller watches. Its ServiceAccount may patch pods in its
// namespace; an admission policy (config/rbac/node_agent_policy.yaml) narrows that to these
// annotations of the Pod its token is bound to.
package ownpod

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// Pod is a component's own Pod.
type Pod struct {
	Pods      corev1client.PodInterface
	Name      string
	Namespace string
}

// New connects to the API server as cfg says, for the component running as the named Pod (from
// POD_NAME and POD_NAMESPACE, the downward API).
func New(cfg *rest.Config, name, namespace string) (*Pod, error) {
	if name == "" || namespace == "" {
		return nil, fmt.Errorf("the Pod's name and namespace are required (POD_NAME and POD_NAMESPACE from the downward API)")
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Pod{Pods: core.Pods(namespace), Name: name, Namespace: namespace}, nil
}

// Annotate merges annotations into the Pod (an empty value is kept as such).
func (p *Pod) Annotate(ctx context.Context, annotations map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	_, err = p.Pods.Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
