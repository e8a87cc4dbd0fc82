package controllers

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
)

// DefaultKindPollInterval is how often a waiting controller asks discovery whether its kinds are served.
const DefaultKindPollInterval = 10 * time.Second

// Starter is a manager runnable that sets up one controller as soon as every kind it requires is
// served by the API server. A missing CRD is logged once; discovery is then polled quietly, so a
// CRD installed after the manager started brings the controller up without a restart.
type Starter struct {
	Controller   Controller
	Manager      ctrl.Manager
	Discovery    discovery.DiscoveryInterface
	PollInterval time.Duration
	Log          logr.Logger
}

var _ ctrl.LeaderElectionRunnable = &Starter{}

// NeedLeaderElection is false: waiting and registering costs nothing, and the controllers it
// registers are themselves leader-elected.
func (s *Starter) NeedLeaderElection() bool { return false }

// Start waits for the required kinds, then runs the controller's Setup. It returns when the
// controller is registered (or ctx ends): the manager keeps running the controller itself.
func (s *Starter) Start(ctx context.Context) error {
	log := s.Log.WithValues("controller", s.Controller.Name)
	interval := s.PollInterval
	if interval <= 0 {
		interval = DefaultKindPollInterval
	}
	logged := map[schema.GroupVersionKind]bool{}
	err := wait.PollUntilContextCancel(ctx, interval, true, func(context.Context) (bool, error) {
		for _, gvk := range s.Controller.Requires {
			served, err := kindServed(s.Discovery, gvk)
			if err != nil {
				log.Error(err, "discovery failed; retrying", "kind", gvk.String())
				return false, nil
			}
			if !served {
				if !logged[gvk] {
					log.Info("waiting for the CustomResourceDefinition to be installed; the controller starts when it is served",
						"group", gvk.Group, "version", gvk.Version, "kind", gvk.Kind)
					logged[gvk] = true
				}
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		// The condition never fails, so the poll ends early only when the manager is stopping.
		return nil //nolint:nilerr // stopping is not a failure
	}
	if len(logged) > 0 {
		log.Info("required kinds are served now; starting")
	}
	if err := s.Controller.Setup(s.Manager); err != nil {
		return fmt.Errorf("setting up controller %q: %w", s.Controller.Name, err)
	}
	log.V(1).Info("controller registered")
	return nil
}

// kindServed reports whether the API server serves kind in its group version.
func kindServed(d discovery.DiscoveryInterface, gvk schema.GroupVersionKind) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(gvk.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Kind == gvk.Kind {
			return true, nil
		}
	}
	return false, nil
}
