// Command quartermaster is the Quartermaster manager: one process hosting every controller.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/iam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents"
	"github.com/quartermaster-dev/quartermaster/internal/controller/mirrors"
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
		mirrors.Controller(),
		intents.Controller(),
	}
}

// subcommands are the other programs of the suite that ship in the same binary and image (the
// registry mirror's cache and its node agent, the pipeline's namespace request); each file that defines one adds it in init. The
// manager runs when the first argument names none of them. Every command, the manager included, reads
// its flags with internal/cli (kubectl's convention: flags before or after the arguments).
var subcommands = map[string]func(ctx context.Context, args []string) error{}

func main() {
	if len(os.Args) > 1 {
		if run, ok := subcommands[os.Args[1]]; ok {
			if err := run(ctrl.SetupSignalHandler(), os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "quartermaster %s: %v\n", os.Args[1], err)
				code := 1
				var coded interface{ ExitCode() int }
				if errors.As(err, &coded) {
					code = coded.ExitCode()
				}
				os.Exit(code)
			}
			return
		}
	}
	scheme := manager.Scheme(computev1alpha1.AddToScheme, iamv1alpha1.AddToScheme, intentv1alpha1.AddToScheme, registryv1alpha1.AddToScheme)
	if err := manager.Run(ctrl.SetupSignalHandler(), os.Args[1:], controllers(), scheme, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "quartermaster:", err)
		os.Exit(1)
	}
}
