// Command quartermaster is the Quartermaster manager: one process hosting every controller.
package main

import (
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/iam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents"
	"github.com/quartermaster-dev/quartermaster/internal/controller/namespaces"
	"github.com/quartermaster-dev/quartermaster/internal/controller/vmgroups"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/registry"
)

// controllers lists every controller the manager can host, in start order.
func controllers() []registry.Controller {
	return []registry.Controller{
		namespaces.Controller(),
		vmgroups.Controller(),
		iam.Controller(),
		intents.Controller(),
	}
}

func main() {
	scheme := manager.Scheme(computev1alpha1.AddToScheme, iamv1alpha1.AddToScheme, intentv1alpha1.AddToScheme)
	if err := manager.Run(ctrl.SetupSignalHandler(), os.Args[1:], controllers(), scheme, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "quartermaster:", err)
		os.Exit(1)
	}
}
