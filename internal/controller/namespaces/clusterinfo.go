package namespaces

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/kubeconfig"
)

// The ConfigMap in which kubeadm-style clusters publish how to reach them.
const (
	clusterInfoNamespace = "kube-public"
	clusterInfoName      = "cluster-info"
	clusterInfoKey       = "kubeconfig"
)

// +kubebuilder:rbac:groups="",namespace=kube-public,resources=configmaps,resourceNames=cluster-info,verbs=get

// serverSource says where the API server URL in handed-out kubeconfigs comes from; the request's
// status message repeats it.
type serverSource string

const (
	fromFlag        serverSource = "--cluster-server"
	fromClusterInfo serverSource = "published in kube-public/cluster-info"
	fromManager     serverSource = "the address the manager itself uses"
)

// publishedCluster reads the API server URL and CA the cluster publishes in
// kube-public/cluster-info. When there is none to use it returns an empty server and why (no such
// ConfigMap, not allowed to read it, no usable kubeconfig in it); err is a failure to ask at all.
func publishedCluster(ctx context.Context, c client.Reader) (server string, ca []byte, why string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cm := &corev1.ConfigMap{}
	err = c.Get(ctx, client.ObjectKey{Namespace: clusterInfoNamespace, Name: clusterInfoName}, cm)
	switch {
	case apierrors.IsNotFound(err):
		return "", nil, "the cluster publishes no kube-public/cluster-info", nil
	case apierrors.IsForbidden(err):
		return "", nil, "reading kube-public/cluster-info is forbidden", nil
	case err != nil:
		return "", nil, "", fmt.Errorf("reading %s/%s: %w", clusterInfoNamespace, clusterInfoName, err)
	}
	server, ca, err = kubeconfig.Published([]byte(cm.Data[clusterInfoKey]))
	if err != nil {
		return "", nil, fmt.Sprintf("kube-public/cluster-info has no usable kubeconfig: %v", err), nil
	}
	return server, ca, "", nil
}
