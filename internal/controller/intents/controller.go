// Package intents is the "intents" controller, a Nimbus-compatible intent engine: SecurityIntents
// bound by SecurityIntentBindings and ClusterSecurityIntentBindings become NimbusPolicies and
// ClusterNimbusPolicies, and those become the engines' policies (KubeArmor, NetworkPolicy,
// Kyverno) for whichever engines the cluster has, in one process.
package intents

import (
	"errors"
	"flag"

	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/registry"
)

// Name is the controller's name in --controllers.
const Name = "intents"

// Options are the controller's flags.
type Options struct {
	Concurrency int
}

// AddFlags registers the controller's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.Concurrency, "intents-concurrency", 16,
		"SecurityIntents and (Cluster)NimbusPolicies of each kind reconciled in parallel, bindings of each kind 4 times as many (each waits on the API server, not the CPU).")
}

func (o *Options) validate() error {
	if o.Concurrency < 1 {
		return errors.New("--intents-concurrency must be at least 1")
	}
	return nil
}

// Kinds are the API kinds the controller serves.
var Kinds = []schema.GroupVersionKind{
	intentv1alpha1.GroupVersion.WithKind("SecurityIntent"),
	intentv1alpha1.GroupVersion.WithKind("SecurityIntentBinding"),
	intentv1alpha1.GroupVersion.WithKind("ClusterSecurityIntentBinding"),
	intentv1alpha1.GroupVersion.WithKind("NimbusPolicy"),
	intentv1alpha1.GroupVersion.WithKind("ClusterNimbusPolicy"),
}

// Controller returns the registry entry of the intents controller. It needs no configuration; it
// restricts no shared cache (Namespaces, Nodes and engine policies live in caches of its own).
func Controller() registry.Controller {
	o := &Options{}
	return registry.Controller{
		Name:       Name,
		Requires:   Kinds,
		AddFlags:   o.AddFlags,
		Configured: o.validate,
		Setup: func(mgr ctrl.Manager) error {
			if err := o.validate(); err != nil {
				return err
			}
			return Setup(mgr, *o)
		},
	}
}
