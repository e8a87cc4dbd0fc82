// Package vmgroups is the "vmgroups" controller: a VmGroup asks for N vSphere VMs cloned from a
// template; the controller keeps them in a folder of their own, scales them, rolls spec changes one
// VM at a time, repairs drift, and deletes them with the VmGroup.
package vmgroups

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
)

// Name is the controller's name in --controllers.
const Name = "vmgroups"

// Options are the controller's flags.
type Options struct {
	Secret           string
	Insecure         bool
	CloneConcurrency int
	MaxReplicas      int
	Resync           time.Duration
	Concurrency      int
	Defaults         vcenter.Placement
}

// AddFlags registers the controller's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Secret, "vsphere-secret", "",
		"Secret (namespace/name) with the vCenter connection: VC_HOST (host, host:port or URL), VC_USER, VC_PASS, optionally VC_CA (PEM CA bundle). The vmgroups controller is off without it.")
	fs.BoolVar(&o.Insecure, "vsphere-insecure", false, "Do not verify vCenter's TLS certificate (self-signed certificates).")
	fs.IntVar(&o.CloneConcurrency, "vsphere-clone-concurrency", 4,
		"Clones running at once (across all VmGroups); also the most VMs one reconcile clones before it reads the spec again.")
	fs.IntVar(&o.MaxReplicas, "vsphere-max-replicas", 100,
		"The most VMs one VmGroup may ask for (the CRD allows up to 1000): a group asking more stalls with a condition naming this flag, and nothing is cloned. 0: the CRD's limit only.")
	fs.DurationVar(&o.Resync, "vsphere-resync", 5*time.Minute, "How often each VmGroup is checked for drift (jittered by 10%).")
	fs.IntVar(&o.Concurrency, "vmgroups-concurrency", 4, "VmGroups reconciled in parallel.")
	fs.StringVar(&o.Defaults.Datacenter, "vsphere-datacenter", "", "Default datacenter (default: the only one).")
	fs.StringVar(&o.Defaults.Folder, "vsphere-folder", "",
		"Default parent folder of the groups' folders: an inventory path or a path under the datacenter's VM folder (default: the VM folder).")
	fs.StringVar(&o.Defaults.ResourcePool, "vsphere-resource-pool", "", "Default resource pool (default: the only one).")
	fs.StringVar(&o.Defaults.Datastore, "vsphere-datastore", "", "Default datastore (default: the template's).")
	fs.StringVar(&o.Defaults.Network, "vsphere-network", "", "Default network of the VMs' first adapter (default: the template's).")
}

// validate reports, naming the flag, why the controller cannot run.
func (o *Options) validate() error {
	if o.Secret == "" {
		return errors.New("--vsphere-secret is not set: name the Secret (namespace/name) holding VC_HOST, VC_USER and VC_PASS")
	}
	if _, err := o.secretRef(); err != nil {
		return err
	}
	switch {
	case o.CloneConcurrency < 1:
		return errors.New("--vsphere-clone-concurrency must be at least 1")
	case o.MaxReplicas < 0:
		return errors.New("--vsphere-max-replicas must not be negative")
	case o.Resync <= 0:
		return errors.New("--vsphere-resync must be positive")
	case o.Concurrency < 1:
		return errors.New("--vmgroups-concurrency must be at least 1")
	}
	return nil
}

func (o *Options) secretRef() (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(o.Secret, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return types.NamespacedName{}, fmt.Errorf("--vsphere-secret %q must be namespace/name", o.Secret)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// Controller returns the registry entry of the vmgroups controller. It needs no restrictions of
// the manager's cache: it watches VmGroups there, and its Secret in a cache of its own.
func Controller() controllers.Controller {
	o := &Options{}
	return controllers.Controller{
		Name:       Name,
		Requires:   []schema.GroupVersionKind{computev1alpha1.GroupVersion.WithKind("VmGroup")},
		AddFlags:   o.AddFlags,
		Configured: o.validate,
		Setup: func(mgr ctrl.Manager, _ *controllers.Kinds) error {
			if err := o.validate(); err != nil {
				return err
			}
			r, err := NewReconciler(mgr, o)
			if err != nil {
				return err
			}
			return r.SetupWithManager(mgr, o.Concurrency)
		},
	}
}
