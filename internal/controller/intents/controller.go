// Package intents is the "intents" controller, a Nimbus-compatible intent engine: SecurityIntents
// bound by SecurityIntentBindings and ClusterSecurityIntentBindings become NimbusPolicies and
// ClusterNimbusPolicies, and those become the engines' policies (KubeArmor, NetworkPolicy,
// Kyverno) for whichever engines the cluster has, in one process. Each intent and binding shows its
// impact on the workloads that already run, read from Kyverno's reports (impact.go, cluster.Reports),
// and SecurityIntentExceptions become Kyverno PolicyExceptions that end at their expiry (the
// exceptions part, package exceptions). docs/development.md says how the parts divide the work.
package intents

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// Name is the controller's name in --controllers.
const Name = "intents"

// Options are the controller's flags.
type Options struct {
	Concurrency int
	// Engines is --intents-engines: "all", "none" or a comma list of EngineNames.
	Engines string
	// KyvernoNamespace is Kyverno's namespace, where its reports controller's Lease is.
	KyvernoNamespace string
	// Exceptions are the SecurityIntentExceptions' flags.
	Exceptions intent.ExceptionRules
}

// EngineNames are --intents-engines' names of the engines.
var EngineNames = map[string]intent.Engine{
	"kubearmor": intent.KubeArmor, "kyverno": intent.Kyverno, "networkpolicy": intent.NetworkPolicy, "k8tls": intent.K8TLS,
}

// engines parses Engines: nil for every engine.
func (o *Options) engines() (map[intent.Engine]bool, error) {
	switch strings.TrimSpace(o.Engines) {
	case "", "all":
		return nil, nil
	case "none":
		return map[intent.Engine]bool{}, nil
	}
	out := map[intent.Engine]bool{}
	for _, name := range strings.Split(o.Engines, ",") {
		e, ok := EngineNames[strings.ToLower(strings.TrimSpace(name))]
		if !ok {
			return nil, fmt.Errorf("--intents-engines: unknown engine %q (want all, none, or a comma list of kubearmor, kyverno, networkpolicy, k8tls)", name)
		}
		out[e] = true
	}
	return out, nil
}

// AddFlags registers the controller's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.Concurrency, "intents-concurrency", 16,
		"SecurityIntents and (Cluster)NimbusPolicies of each kind reconciled in parallel, bindings of each kind 4 times as many (each waits on the API server, not the CPU).")
	fs.StringVar(&o.Engines, "intents-engines", "all",
		"The policy engines the intents controller writes for: all, none (only (Cluster)NimbusPolicies, as Nimbus's core alone), or a comma list of kubearmor, kyverno, networkpolicy, k8tls. "+
			"Each is used once it is detected; a left-out engine is neither watched nor written, and its existing objects are left alone.")
	fs.StringVar(&o.Exceptions.Namespace, "intents-exception-namespace", "",
		"The namespace where Kyverno accepts PolicyExceptions (Kyverno's --exceptionNamespace, chart features.policyExceptions.namespace): SecurityIntentExceptions become PolicyExceptions there. Empty: SecurityIntentExceptions are refused (Stalled, ExceptionsDisabled).")
	fs.DurationVar(&o.Exceptions.MaxTTL, "intents-exception-max-ttl", 30*24*time.Hour,
		"The longest a SecurityIntentException may last: its spec.expires at most this long after its creation (a longer one is refused; a later renewal is a new exception).")
	fs.DurationVar(&o.Exceptions.Warning, "intents-exception-expiry-warning", 72*time.Hour,
		"How long before its expiry a SecurityIntentException says ExpiresSoon (its Ready reason, a Warning Event, quartermaster_objects state expiring).")
	fs.Func("intents-exception-admin-namespaces",
		"Comma list of namespaces whose SecurityIntentExceptions may exempt workloads of other namespaces (their spec.workloads.namespaces may name others, or \"*\" for every namespace). Exceptions elsewhere exempt only their own namespace's workloads.",
		func(v string) error {
			o.Exceptions.AdminNamespaces = nil
			for _, ns := range strings.Split(v, ",") {
				if ns = strings.TrimSpace(ns); ns != "" {
					o.Exceptions.AdminNamespaces = append(o.Exceptions.AdminNamespaces, ns)
				}
			}
			return nil
		})
	fs.BoolVar(&o.Exceptions.AllowEverything, "intents-exception-allow-everything", false,
		"Let an admin namespace's SecurityIntentException exempt every workload of every namespace (namespaces [\"*\"] and an empty selector); refused otherwise.")
	fs.StringVar(&o.KyvernoNamespace, "intents-kyverno-namespace", "kyverno",
		"Kyverno's namespace: the intents' impact on existing workloads is read from Kyverno's PolicyReports while the reports controller's Lease there is renewed, and is Unknown otherwise.")
}

func (o *Options) validate() error {
	if o.Concurrency < 1 {
		return errors.New("--intents-concurrency must be at least 1")
	}
	if o.KyvernoNamespace == "" {
		return errors.New("--intents-kyverno-namespace must name Kyverno's namespace")
	}
	if o.Exceptions.MaxTTL <= 0 {
		return errors.New("--intents-exception-max-ttl must be positive")
	}
	if o.Exceptions.Warning < 0 {
		return errors.New("--intents-exception-expiry-warning must not be negative")
	}
	_, err := o.engines()
	return err
}

// Kinds are the API kinds the controller serves.
var Kinds = []schema.GroupVersionKind{
	intentv1alpha1.GroupVersion.WithKind("SecurityIntent"),
	intentv1alpha1.GroupVersion.WithKind("SecurityIntentBinding"),
	intentv1alpha1.GroupVersion.WithKind("ClusterSecurityIntentBinding"),
	intentv1alpha1.GroupVersion.WithKind("NimbusPolicy"),
	intentv1alpha1.GroupVersion.WithKind("ClusterNimbusPolicy"),
	securityv1alpha1.GroupVersion.WithKind("SecurityIntentException"),
}

// Controller returns the registry entry of the intents controller. It needs no configuration; it
// restricts no shared cache (Namespaces, Nodes and engine policies live in caches of its own).
func Controller() controllers.Controller {
	o := &Options{}
	return controllers.Controller{
		Name:       Name,
		Requires:   Kinds,
		AddFlags:   o.AddFlags,
		Configured: o.validate,
		Setup: func(mgr ctrl.Manager, kinds *controllers.Kinds) error {
			if err := o.validate(); err != nil {
				return err
			}
			return Setup(mgr, kinds, *o)
		},
	}
}
