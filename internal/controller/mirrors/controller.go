// Package mirrors is the "mirrors" controller: each RegistryMirror becomes, in the operator's
// namespace, a pull-through cache of its upstream (a StatefulSet behind two Services, with its
// configuration Secret and a PodDisruptionBudget) and a DaemonSet of the node agent that points
// every node's containerd at it.
package mirrors

import (
	"errors"
	"flag"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
)

// Name is the controller's name in --controllers.
const Name = "mirrors"

// Options are the controller's flags.
type Options struct {
	Namespace           string
	Image               string
	AgentServiceAccount string
	CacheServiceAccount string
	Concurrency         int
	Resync              time.Duration
	// CheckUpstream: the controller asks each upstream whether the mirror's credentials work.
	CheckUpstream bool
	// PrepareStorage: the caches' StatefulSets make fresh volumes writable (mirror.Install).
	PrepareStorage bool
	// PinByUse: the images the cluster's Pods and workloads name are pinned in their mirror's
	// cache (pins.go).
	PinByUse bool
}

// AddFlags registers the controller's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Namespace, "mirrors-namespace", "quartermaster-mirrors", "Namespace of every mirror's cache, node agent and credentials Secret.")
	fs.StringVar(&o.Image, "mirrors-image", "quartermaster:dev", "Image of the mirrors' cache and node agent: Quartermaster's own image (they are its registry-mirror and node-agent subcommands).")
	fs.StringVar(&o.AgentServiceAccount, "mirrors-agent-service-account", "quartermaster-node-agent", "ServiceAccount of the node agents, in --mirrors-namespace (installed with the operator).")
	fs.StringVar(&o.CacheServiceAccount, "mirrors-cache-service-account", "quartermaster-mirror-cache", "ServiceAccount of the cache pods, in --mirrors-namespace (installed with the operator): they note on their own Pods what they hold of the pins and which fetches failed, for the mirrors' status. Empty: the caches run without an API token, and status.pinnedSize and the Warmed condition stay unknown.")
	fs.IntVar(&o.Concurrency, "mirrors-concurrency", 4, "RegistryMirrors reconciled in parallel.")
	fs.DurationVar(&o.Resync, "mirrors-resync", 10*time.Minute, "How often a ready mirror's objects and upstream are checked again.")
	fs.BoolVar(&o.PrepareStorage, "mirrors-prepare-storage", true, "Give each cache pod an init container that makes a fresh, empty volume owned by root writable by the cache (as root with CAP_CHOWN alone, changing only the volume's owner): for provisioners that ignore fsGroup. Off: such a volume stalls the mirror with a message naming it.")
	fs.BoolVar(&o.PinByUse, "mirrors-pin-by-use", true, "Keep in each mirror's cache, whatever its ttl, the images the cluster's Pods and workload templates name (and for ttl after the last does): the controller reads every namespace's Pods, Deployments, StatefulSets, DaemonSets, Jobs and CronJobs, keeping only their images, and every Node, keeping only its platform (the caches warm a multi-platform image for each). Off: nothing is pinned.")
	fs.BoolVar(&o.CheckUpstream, "mirrors-check-upstream", true, "Ask each upstream whether the mirror's credentials are accepted (a 401 stalls the mirror with a clear reason). Turn off where the operator has no egress.")
}

func (o *Options) validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Label(o.Namespace); len(msgs) > 0 {
		errs = append(errs, errors.New("--mirrors-namespace: "+msgs[0]))
	}
	if o.Image == "" {
		errs = append(errs, errors.New("--mirrors-image must name Quartermaster's image"))
	}
	if msgs := validation.IsDNS1123Subdomain(o.AgentServiceAccount); len(msgs) > 0 {
		errs = append(errs, errors.New("--mirrors-agent-service-account: "+msgs[0]))
	}
	if o.CacheServiceAccount != "" {
		if msgs := validation.IsDNS1123Subdomain(o.CacheServiceAccount); len(msgs) > 0 {
			errs = append(errs, errors.New("--mirrors-cache-service-account: "+msgs[0]))
		}
	}
	if o.Concurrency < 1 {
		errs = append(errs, errors.New("--mirrors-concurrency must be at least 1"))
	}
	if o.Resync < time.Minute {
		errs = append(errs, errors.New("--mirrors-resync must be at least 1m"))
	}
	return errors.Join(errs...)
}

// Kinds are the API kinds the controller serves.
var Kinds = []schema.GroupVersionKind{registryv1alpha1.GroupVersion.WithKind("RegistryMirror")}

// Controller returns the registry entry of the mirrors controller. Its namespaced objects live in
// a cache of its own (one namespace), so it narrows no shared cache.
func Controller() controllers.Controller {
	o := &Options{}
	return controllers.Controller{
		Name:       Name,
		Requires:   Kinds,
		AddFlags:   o.AddFlags,
		Configured: o.validate,
		Setup: func(mgr ctrl.Manager, _ *controllers.Kinds) error {
			if err := o.validate(); err != nil {
				return err
			}
			return Setup(mgr, *o)
		},
	}
}
