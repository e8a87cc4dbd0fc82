// Package namespaces is the "namespaces" controller: a ConfigMap named N in the requests namespace
// asks for namespace N; the controller creates it with an admin ServiceAccount, RBAC and the
// configured defaults, and hands back a kubeconfig scoped to N in a Secret named N beside the request.
package namespaces

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/pipelineid"
)

// Name is the controller's name in --controllers.
const Name = "namespaces"

// Options are the controller's flags.
type Options struct {
	RequestsNamespace string
	OperatorNamespace string
	DefaultsFile      string
	ClusterServer     string
	ClusterCAFile     string
	TokenTTL          time.Duration
	MaxTokenTTL       time.Duration
	MaxTTL            time.Duration
	DenyNames         string
	AllowNames        string
	Concurrency       int
	// CopyFromNamespace holds the Secrets and ConfigMaps the defaults copy into every namespace.
	CopyFromNamespace string
	// ExchangeAddress and ExchangeCertDir serve the keyless path (exchange.go); off when the address is empty.
	ExchangeAddress string
	ExchangeCertDir string

	// ExchangeClient fetches the issuers' discovery documents and keys (nil: a client with the
	// system's roots; no flag: tests and the benchmark trust their loopback issuers through it).
	ExchangeClient *http.Client
	// exchangeListening is told the exchange's address (tests bind port 0).
	exchangeListening func(net.Addr)
	// exchangeUp is set while the exchange listens.
	exchangeUp atomic.Bool
}

// AddFlags registers the controller's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.RequestsNamespace, "requests-namespace", "namespace-requests",
		"Namespace whose ConfigMaps are namespace requests (a ConfigMap named N asks for namespace N).")
	fs.StringVar(&o.OperatorNamespace, "operator-namespace", defaultOperatorNamespace(),
		"The operator's own namespace, never handed out (default: $POD_NAMESPACE, the in-cluster namespace, or quartermaster-system).")
	fs.StringVar(&o.DefaultsFile, "namespace-defaults", "",
		"YAML file with the ResourceQuota, LimitRange and network isolation every requested namespace gets (see docs/namespaces.md).")
	fs.StringVar(&o.ClusterServer, "cluster-server", "",
		"API server URL written into handed-out kubeconfigs (default: the one the cluster publishes in kube-public/cluster-info, else the URL the manager itself uses).")
	fs.StringVar(&o.ClusterCAFile, "cluster-ca-file", "",
		"CA bundle written into handed-out kubeconfigs (default: the CA the manager itself trusts).")
	fs.DurationVar(&o.TokenTTL, "token-ttl", 24*time.Hour, "Lifetime of handed-out tokens; a request may ask for another with data key token-ttl.")
	fs.DurationVar(&o.MaxTokenTTL, "max-token-ttl", 7*24*time.Hour, "Upper bound of a request's token-ttl.")
	fs.DurationVar(&o.MaxTTL, "max-ttl", 0, "Upper bound of a request's namespace ttl; 0 means unbounded.")
	fs.StringVar(&o.DenyNames, "deny-names", strings.Join(nsrequest.DefaultDenyNames, ","),
		"Comma-separated regular expressions (anchored) of namespace names that are refused. The requests and operator namespaces are always refused.")
	fs.StringVar(&o.AllowNames, "allow-names", "",
		"Comma-separated regular expressions (anchored); when set, only matching namespace names are accepted.")
	fs.IntVar(&o.Concurrency, "namespaces-concurrency", 16, "Requests reconciled in parallel (each waits on the API server, not the CPU).")
	fs.StringVar(&o.CopyFromNamespace, "copy-from-namespace", "",
		"Namespace of the Secrets and ConfigMaps the defaults' copy lists name (each must carry the label quartermaster.dev/copy-source=true); the manager needs the ClusterRole quartermaster-namespaces-copy-source bound there. Empty: nothing is copied.")
	fs.StringVar(&o.ExchangeAddress, "exchange-bind-address", "",
		"Address (e.g. :8443) on which CI jobs exchange their OIDC identity tokens for namespaces, over TLS (see TrustedIssuer and docs/namespaces.md); empty: off.")
	fs.StringVar(&o.ExchangeCertDir, "exchange-cert-dir", "/etc/quartermaster/exchange-tls",
		"Directory holding the exchange's serving certificate, tls.crt and tls.key (read again when they change).")
}

func defaultOperatorNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "quartermaster-system"
}

// policy compiles the options; errors name the flag at fault.
func (o *Options) policy() (*nsrequest.Policy, *nsrequest.Defaults, error) {
	deny, err := nsrequest.CompilePatterns(strings.Split(o.DenyNames, ","))
	if err != nil {
		return nil, nil, fmt.Errorf("--deny-names: %w", err)
	}
	allow, err := nsrequest.CompilePatterns(strings.Split(o.AllowNames, ","))
	if err != nil {
		return nil, nil, fmt.Errorf("--allow-names: %w", err)
	}
	defaults, err := nsrequest.LoadDefaults(o.DefaultsFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--namespace-defaults: %w", err)
	}
	if o.RequestsNamespace == "" {
		return nil, nil, fmt.Errorf("--requests-namespace must not be empty")
	}
	switch {
	case defaults.Copying() && o.CopyFromNamespace == "":
		return nil, nil, fmt.Errorf("--namespace-defaults names objects to copy: set --copy-from-namespace to the namespace that holds them")
	case o.CopyFromNamespace != "" && o.CopyFromNamespace == o.RequestsNamespace:
		return nil, nil, fmt.Errorf("--copy-from-namespace must not be the requests namespace (pipelines read Secrets there)")
	}
	if o.TokenTTL < nsrequest.MinTokenTTL {
		return nil, nil, fmt.Errorf("--token-ttl must be at least %s (the TokenRequest API's minimum)", nsrequest.MinTokenTTL)
	}
	if o.MaxTokenTTL < o.TokenTTL {
		return nil, nil, fmt.Errorf("--max-token-ttl (%s) must not be shorter than --token-ttl (%s)", o.MaxTokenTTL, o.TokenTTL)
	}
	return &nsrequest.Policy{
		RequestsNamespace: o.RequestsNamespace,
		OperatorNamespace: o.OperatorNamespace,
		Deny:              deny,
		Allow:             allow,
		TokenTTL:          o.TokenTTL,
		MaxTokenTTL:       o.MaxTokenTTL,
		MaxTTL:            o.MaxTTL,
		CopyFrom:          o.CopyFromNamespace,
	}, defaults, nil
}

// Controller returns the registry entry of the namespaces controller.
func Controller() controllers.Controller { return (&Options{}).controller() }

// ControllerOf is the registry entry configured by o (its flags parsed into o): for the benchmark,
// which sets what no flag does (ExchangeClient).
func ControllerOf(o *Options) controllers.Controller { return o.controller() }

// controller is the registry entry of the namespaces controller configured by o.
func (o *Options) controller() controllers.Controller {
	return controllers.Controller{
		Name:     Name,
		AddFlags: o.AddFlags,
		Configured: func() error {
			_, _, err := o.policy()
			return err
		},
		CacheByObject:    o.cacheByObject,
		Readyz:           o.readyz,
		NoNamespaceIndex: noNamespaceIndex,
		Setup: func(mgr ctrl.Manager, _ *controllers.Kinds) error {
			policy, defaults, err := o.policy()
			if err != nil {
				return err
			}
			r, err := NewReconciler(mgr, policy, defaults, o.ClusterServer, o.ClusterCAFile)
			if err != nil {
				return err
			}
			if o.ExchangeAddress != "" {
				client := o.ExchangeClient
				if client == nil {
					client = &http.Client{Timeout: 10 * time.Second}
				}
				if err := addExchange(mgr, o, policy, defaults, &pipelineid.Verifier{Client: client}); err != nil {
					return err
				}
			}
			return r.SetupWithManager(mgr, o.Concurrency)
		},
	}
}

// readyz is the controller's part of the manager's /readyz: with the exchange on, ready once it
// listens.
func (o *Options) readyz(*http.Request) error {
	if o.ExchangeAddress != "" && !o.exchangeUp.Load() {
		return errors.New("the token exchange is not listening yet")
	}
	return nil
}

// noNamespaceIndex are the kinds the controller caches per requested namespace and reads by name
// only (and Namespaces, which are in no namespace): no other controller uses them, and client-go's
// per-namespace index would cost a set per namespace and kind.
var noNamespaceIndex = []client.Object{&corev1.Namespace{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}, &corev1.ResourceQuota{}, &corev1.LimitRange{}}

// cacheByObject keeps the cache to what the controller owns: ConfigMaps and Secrets of the requests
// namespace only (the manager has no RBAC for them elsewhere), and everything else by label, with
// what repeats across requested namespaces stored once (cache_content.go).
func (o *Options) cacheByObject() map[client.Object]cache.ByObject {
	managed := labels.SelectorFromSet(labels.Set{nsrequest.LabelManagedBy: nsrequest.ManagedByValue})
	inRequests := map[string]cache.Config{o.RequestsNamespace: {}}
	byLabel := cache.ByObject{Label: managed, Transform: internContent}
	shared := cache.ByObject{Label: managed, Transform: shareDefaults}
	configMaps := cache.ByObject{Namespaces: map[string]cache.Config{o.RequestsNamespace: {}}}
	secrets := cache.ByObject{Namespaces: map[string]cache.Config{o.RequestsNamespace: {LabelSelector: managed}}, Transform: summarizeCredentials}
	if o.CopyFromNamespace != "" {
		// The sources of the copies, whole, and only those marked as such.
		sources := cache.Config{LabelSelector: labels.SelectorFromSet(labels.Set{nsrequest.LabelCopySource: "true"})}
		configMaps.Namespaces[o.CopyFromNamespace] = sources
		secrets.Namespaces[o.CopyFromNamespace] = sources
	}
	return map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}:           configMaps,
		&coordinationv1.Lease{}:       {Namespaces: inRequests, Label: labels.SelectorFromSet(labels.Set{LabelUsedToken: "true"})},
		&corev1.Secret{}:              secrets,
		&corev1.Namespace{}:           byLabel,
		&corev1.ServiceAccount{}:      byLabel,
		&rbacv1.Role{}:                byLabel,
		&rbacv1.RoleBinding{}:         byLabel,
		&corev1.ResourceQuota{}:       shared,
		&corev1.LimitRange{}:          shared,
		&networkingv1.NetworkPolicy{}: shared,
	}
}
