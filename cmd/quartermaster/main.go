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
	nsv1alpha1 "github.com/quartermaster-dev/quartermaster/api/namespaces/v1alpha1"
	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/iam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents"
	"github.com/quartermaster-dev/quartermaster/internal/controller/mirrors"
	"github.com/quartermaster-dev/quartermaster/internal/controller/namespaces"
	"github.com/quartermaster-dev/quartermaster/internal/controller/vmgroups"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
)

// hosted lists every controller the manager can host, in start order.
func hosted() []controllers.Controller {
	return []controllers.Controller{
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
				leaveTerminationMessage(err.Error())
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
	scheme := manager.Scheme(computev1alpha1.AddToScheme, iamv1alpha1.AddToScheme, intentv1alpha1.AddToScheme, securityv1alpha1.AddToScheme, nsv1alpha1.AddToScheme, registryv1alpha1.AddToScheme)
	if err := manager.Run(ctrl.SetupSignalHandler(), os.Args[1:], hosted(), scheme, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "quartermaster:", err)
		leaveTerminationMessage(err.Error())
		os.Exit(1)
	}
}

// terminationLog is where the kubelet reads a container's termination message (a Pod's default
// terminationMessagePath): a command that ends in a Pod leaves there why, so kubectl describe pod
// and the controllers that read the Pod's status (the mirrors controller reads its caches') show
// it without the logs.
const terminationLog = "/dev/termination-log"

// leaveTerminationMessage writes msg to the termination log when there is one (in a container;
// it is never created elsewhere), cut to the 4096 bytes the kubelet keeps.
func leaveTerminationMessage(msg string) {
	f, err := os.OpenFile(terminationLog, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return
	}
	defer f.Close()
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	_, _ = f.WriteString(msg)
}
