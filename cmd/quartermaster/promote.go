package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cli"
)

func init() {
	subcommands["promote"] = promote
}

// promoteUsage is `quartermaster promote --help`, above its flags.
var promoteUsage = cli.Usage{
	Command: "quartermaster promote",
	Args:    "SECURITYINTENT",
	About: `Switches a SecurityIntent from Audit to Block only when nothing it would refuse already runs.
It reads the intent's status.impact (what Kyverno's scans of the existing workloads found against
its policies, in every binding), at the intent's current generation:
  - violations: refused (exit 2), the violating workloads listed; fix them, exempt them, or --force;
  - impact Unknown (Kyverno's reports unreadable), NotScanned (no engine that enforces the
    intent reports on existing workloads), or a policy Kyverno has not reported on yet (its scan
    not complete): refused (exit 2) unless --force, since nothing can say what Block would break;
  - none: the action is set to Block (guarded by the intent's resourceVersion: an edit meanwhile
    refuses, run again), and the command waits until Block is in force: the intent Ready at the
    new generation, which it is once every binding naming it has put that generation in force.
An intent that is not Ready now is refused too (Block would not be in force either) unless --force.
A workload admitted in the seconds between the check and Block taking effect is not refused; the
impact read once Block is in force is printed, and any violation it lists is a warning.
Exit status: 0 promoted (or already Block), 2 refused, 1 any other error or the timeout.`,
	Examples: []string{
		"# Promote when nothing would break, else list what would\nquartermaster promote escape-to-host",
		"# Only check\nquartermaster promote escape-to-host --dry-run",
		"# Promote although existing workloads violate it (they keep running; new ones are refused)\nquartermaster promote escape-to-host --force",
	},
}

type promoteOptions struct {
	name    string
	force   bool
	dryRun  bool
	timeout time.Duration
}

func promoteFlags(args []string, out io.Writer) (promoteOptions, error) {
	fs := flag.NewFlagSet("promote", flag.ContinueOnError)
	fs.SetOutput(out)
	var o promoteOptions
	fs.BoolVar(&o.force, "force", false, "promote even when existing workloads violate the intent, or its impact is Unknown or NotScanned")
	fs.BoolVar(&o.dryRun, "dry-run", false, "check and print what promotion would do, change nothing")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long to wait for the intent's impact and, after promotion, for Block to be in force")
	config.RegisterFlags(fs)
	names, err := cli.Parse(fs, promoteUsage, args)
	if err != nil {
		return o, err
	}
	if len(names) != 1 {
		return o, promoteUsage.Errorf("want exactly one argument, the SecurityIntent's name, got %q", names)
	}
	o.name = names[0]
	return o, nil
}

// promoteRefused is a promotion refused for what the impact says: exit status 2.
type promoteRefused struct{ msg string }

func (r *promoteRefused) Error() string { return r.msg }
func (r *promoteRefused) ExitCode() int { return 2 }

func promote(ctx context.Context, args []string) error {
	o, err := promoteFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("no API server to talk to (use --kubeconfig or KUBECONFIG): %w", err)
	}
	scheme := runtime.NewScheme()
	if err := intentv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	return runPromote(ctx, c, o, os.Stdout)
}

const promotePoll = 500 * time.Millisecond

// runPromote is promote with its client and output.
func runPromote(ctx context.Context, c client.Client, o promoteOptions, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	ref := "securityintent.intent.security.nimbus.com/" + o.name
	si := &intentv1alpha1.SecurityIntent{}
	if err := c.Get(ctx, client.ObjectKey{Name: o.name}, si); err != nil {
		return err
	}
	if si.Spec.Intent.Action == intentv1alpha1.ActionBlock {
		fmt.Fprintf(out, "%s is already Block\n", ref)
		return nil
	}
	// The impact must describe the intent as it is now.
	si, err := waitIntent(ctx, c, o.name, "its impact at generation", func(si *intentv1alpha1.SecurityIntent) bool {
		return si.Status.ObservedGeneration == si.Generation && si.Status.Impact != nil
	})
	if err != nil {
		return err
	}
	if ready := meta.FindStatusCondition(si.Status.Conditions, "Ready"); ready == nil || ready.Status != metav1.ConditionTrue {
		fmt.Fprintf(out, "%s is not in force now: %s\n", ref, conditionText(ready))
		if !o.force {
			return &promoteRefused{"not promoted: Block would not be in force either; make the intent Ready first (or use --force)"}
		}
		fmt.Fprintln(out, "--force: promoting anyway")
	}
	imp := si.Status.Impact
	switch {
	case imp.State == intentv1alpha1.ImpactCurrent && imp.Violations != nil && *imp.Violations > 0:
		fmt.Fprintf(out, "%d existing workloads violate %s (%s):\n", *imp.Violations, o.name, imp.Message)
		printViolating(out, imp)
		if !o.force {
			return &promoteRefused{fmt.Sprintf("not promoted: Block would refuse %d workloads that run now (fix them or exempt them, or use --force)", *imp.Violations)}
		}
		fmt.Fprintln(out, "--force: promoting anyway; they keep running, new ones like them are refused")
	case imp.State == intentv1alpha1.ImpactCurrent && len(imp.Unreported) > 0:
		fmt.Fprintf(out, "Kyverno has not reported on %s yet (%s)\n", strings.Join(imp.Unreported, ", "), imp.Message)
		if !o.force {
			return &promoteRefused{"not promoted: the scan of the existing workloads is not complete, so what Block would refuse is not known yet (run again once it is, or use --force)"}
		}
		fmt.Fprintln(out, "--force: promoting anyway")
	case imp.State != intentv1alpha1.ImpactCurrent:
		fmt.Fprintf(out, "the impact of %s is %s: %s\n", o.name, imp.State, imp.Message)
		if !o.force {
			return &promoteRefused{"not promoted: what Block would refuse cannot be known (use --force to promote anyway)"}
		}
		fmt.Fprintln(out, "--force: promoting anyway")
	default:
		fmt.Fprintf(out, "no existing workload violates %s (%s)\n", o.name, imp.Message)
	}
	if o.dryRun {
		fmt.Fprintf(out, "%s would be promoted (Audit → Block) (dry run)\n", ref)
		return nil
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": si.ResourceVersion},
		"spec":     map[string]any{"intent": map[string]any{"action": intentv1alpha1.ActionBlock}},
	})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, si, client.RawPatch(types.MergePatchType, patch)); err != nil {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("%s changed while its impact was read; run again: %w", ref, err)
		}
		return err
	}
	generation := si.Generation
	fmt.Fprintf(out, "%s promoted (Audit → Block)\n", ref)
	// Concluded at the new generation: Ready (every binding naming it has put this generation in
	// force: Kyverno has the Enforce policies), or Stalled.
	si, err = waitIntent(ctx, c, o.name, "Block to be in force (Ready at the new generation)", func(si *intentv1alpha1.SecurityIntent) bool {
		ready := meta.FindStatusCondition(si.Status.Conditions, "Ready")
		stalled := meta.FindStatusCondition(si.Status.Conditions, "Stalled")
		return si.Status.ObservedGeneration >= generation && ready != nil && ready.ObservedGeneration >= generation &&
			(ready.Status == metav1.ConditionTrue || (stalled != nil && stalled.Status == metav1.ConditionTrue))
	})
	if err != nil {
		return err
	}
	ready := meta.FindStatusCondition(si.Status.Conditions, "Ready")
	if ready.Status != metav1.ConditionTrue {
		return fmt.Errorf("%s is Block but not in force: %s", ref, conditionText(ready))
	}
	fmt.Fprintf(out, "Block is in force: %s\n", ready.Message)
	if imp := si.Status.Impact; imp != nil && imp.State == intentv1alpha1.ImpactCurrent && imp.Violations != nil && *imp.Violations > 0 {
		fmt.Fprintf(out, "Warning: %d workloads admitted before Block took effect violate it:\n", *imp.Violations)
		printViolating(out, imp)
	}
	return nil
}

// waitIntent polls the intent until cond holds, and fails naming what it waited for.
func waitIntent(ctx context.Context, c client.Client, name, what string, cond func(*intentv1alpha1.SecurityIntent) bool) (*intentv1alpha1.SecurityIntent, error) {
	si := &intentv1alpha1.SecurityIntent{}
	var last error
	err := wait.PollUntilContextCancel(ctx, promotePoll, true, func(ctx context.Context) (bool, error) {
		got := &intentv1alpha1.SecurityIntent{}
		if last = c.Get(ctx, client.ObjectKey{Name: name}, got); last != nil {
			return false, nil //nolint:nilerr // kept, and named if the wait times out: a read may fail and the next succeed
		}
		si = got
		return cond(got), nil
	})
	if err != nil {
		if last != nil {
			return nil, fmt.Errorf("waiting for %s of SecurityIntent %s: %w", what, name, last)
		}
		return nil, fmt.Errorf("timed out waiting for %s of SecurityIntent %s (--timeout): it is at generation %d, its status describes %d, %s",
			what, name, si.Generation, si.Status.ObservedGeneration, conditionText(meta.FindStatusCondition(si.Status.Conditions, "Ready")))
	}
	return si, nil
}

// printViolating writes the impact's violating workloads as kubectl writes a table.
func printViolating(out io.Writer, imp *intentv1alpha1.Impact) {
	w := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, "NAMESPACE\tKIND\tNAME\tPOLICY\tMESSAGE")
	for _, v := range imp.Violating {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", v.Namespace, v.Kind, v.Name, v.Policy, strings.ReplaceAll(v.Message, "\n", " "))
	}
	_ = w.Flush()
	if more := int(*imp.Violations) - len(imp.Violating); more > 0 {
		fmt.Fprintf(out, "... and %d more (the impact names the first %d)\n", more, len(imp.Violating))
	}
}

// conditionText is a Ready condition as a sentence.
func conditionText(c *metav1.Condition) string {
	if c == nil {
		return "no Ready condition yet"
	}
	return fmt.Sprintf("Ready %s %s at generation %d: %s", c.Status, c.Reason, c.ObservedGeneration, c.Message)
}
