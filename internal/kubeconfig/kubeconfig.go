// Package kubeconfig renders a kubeconfig file that authenticates with a bearer token.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Params describe a token-authenticated kubeconfig with one cluster, user and context.
type Params struct {
	// Name names the cluster, user and context entries.
	Name string
	// Server is the API server URL.
	Server string
	// CAData is the PEM bundle that verifies the server; empty means the system roots.
	CAData []byte
	// Token is the bearer token.
	Token string
	// Namespace is the context's default namespace; optional.
	Namespace string
}

// Render returns the kubeconfig as YAML.
func Render(p Params) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[p.Name] = &clientcmdapi.Cluster{Server: p.Server, CertificateAuthorityData: p.CAData}
	cfg.AuthInfos[p.Name] = &clientcmdapi.AuthInfo{Token: p.Token}
	cfg.Contexts[p.Name] = &clientcmdapi.Context{Cluster: p.Name, AuthInfo: p.Name, Namespace: p.Namespace}
	cfg.CurrentContext = p.Name
	return clientcmd.Write(*cfg)
}

// Server returns the API server URL of a kubeconfig's current context.
func Server(data []byte) (string, error) {
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return "", err
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return "", fmt.Errorf("kubeconfig has no current context")
	}
	cluster, ok := cfg.Clusters[ctx.Cluster]
	if !ok {
		return "", fmt.Errorf("kubeconfig has no cluster %q", ctx.Cluster)
	}
	return cluster.Server, nil
}

// Published returns the API server URL and CA of the kubeconfig a cluster publishes in
// kube-public/cluster-info (as kubeadm does): one cluster entry, no context or user.
func Published(data []byte) (server string, ca []byte, err error) {
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return "", nil, err
	}
	if len(cfg.Clusters) != 1 {
		return "", nil, fmt.Errorf("want one cluster, found %d", len(cfg.Clusters))
	}
	for _, c := range cfg.Clusters {
		server, ca = c.Server, c.CertificateAuthorityData
	}
	if server == "" {
		return "", nil, fmt.Errorf("the cluster has no server")
	}
	return server, ca, nil
}
