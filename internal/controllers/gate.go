package controllers

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
)

// Starter is a manager runnable that sets up one controller as soon as every kind it requires is
// served by the API server. A missing CRD is logged once; Kinds then looks for it quietly, so a
// CRD installed after the manager started brings the controller up without a restart.
type Starter struct {
	Controller Controller
	Manager    ctrl.Manager
	Kinds      *Kinds
	Log        logr.Logger
}

var _ ctrl.LeaderElectionRunnable = &Starter{}

// NeedLeaderElection is false: waiting and registering costs nothing, and the controllers it
// registers are themselves leader-elected.
func (s *Starter) NeedLeaderElection() bool { return false }

// Start waits for the required kinds, then runs the controller's Setup. It returns when the
// controller is registered (or ctx ends): the manager keeps running the controller itself.
func (s *Starter) Start(ctx context.Context) error {
	log := s.Log.WithValues("controller", s.Controller.Name)
	need := Need{Name: "the " + s.Controller.Name + " controller's kinds", Kinds: s.Controller.Requires}
	waited := !s.Kinds.Check(ctx, need)
	if waited {
		missing, _ := s.Kinds.Missing(need)
		log.Info("waiting for the CustomResourceDefinition to be installed; the controller starts when it is served",
			"missing", missing)
		if err := s.Kinds.Wait(ctx, need); err != nil {
			return nil //nolint:nilerr // the wait ends early only when the manager is stopping
		}
		log.Info("required kinds are served now; starting")
	}
	if err := s.Controller.Setup(s.Manager, s.Kinds); err != nil {
		return fmt.Errorf("setting up controller %q: %w", s.Controller.Name, err)
	}
	log.V(1).Info("controller registered")
	return nil
}
