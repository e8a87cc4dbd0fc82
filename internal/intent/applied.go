package intent

import (
	"fmt"
	"strings"
)

// Applied is what bringing a (Cluster)NimbusPolicy's engine policies to the generated ones found
// and did.
type Applied struct {
	Entries   []string // the generated policies that exist, as status.adapterPolicies lists them
	Conflicts []string // objects in the way that the parent does not control
	Missing   []Engine // engines not installed
	Disabled  []Engine // engines --intents-engines leaves out
	Changes   []string // what was created, updated, deleted: one Event says it
	Shadowed  []string // policies an earlier rule of the same id already makes
	Rejected  []string // policies the API server (or an engine's webhook) refuses as they are
	Pending   []string // policies their engine has not taken in yet, with what it says
}

// Readiness is how a parent's Ready condition reads.
type Readiness int

const (
	// Enforced is a parent whose every generated policy is in force.
	Enforced Readiness = iota
	// WaitingForEngine is a parent with a policy its engine has not taken in yet; no one needs
	// to act.
	WaitingForEngine
	// NeedsPerson is a parent that stays as it is until someone acts (a conflict, a refusal, an
	// engine to install).
	NeedsPerson
)

// Verdict is a parent's readiness with its Ready condition's reason and message.
type Verdict struct {
	Readiness
	Reason, Message string
}

// Verdict says how the parent's Ready reads after a (successful) apply; unenforced is what
// nothing enforces of its rules (Unenforced).
func (a Applied) Verdict(unenforced []string) Verdict {
	switch {
	case len(a.Conflicts) > 0:
		return Verdict{NeedsPerson, "Conflict", fmt.Sprintf("%s exist and were not generated from this policy; they are left alone (delete or rename them)",
			strings.Join(a.Conflicts, ", "))}
	case len(a.Rejected) > 0:
		return Verdict{NeedsPerson, "Rejected", "refused by the API server: " + strings.Join(a.Rejected, "; ")}
	case len(a.Missing) > 0:
		return Verdict{NeedsPerson, "EngineNotInstalled", a.Summary(unenforced)}
	case len(a.Pending) > 0:
		return Verdict{WaitingForEngine, "WaitingForEngine", a.Summary(unenforced)}
	}
	return Verdict{Enforced, "Generated", a.Summary(unenforced)}
}

// Summary is what the parent's status says of the applied policies.
func (a Applied) Summary(unenforced []string) string {
	msg := fmt.Sprintf("%d engine policies", len(a.Entries))
	if len(a.Pending) > 0 {
		msg += "; waiting for their engine to accept " + strings.Join(a.Pending, ", ")
	}
	if len(a.Missing) > 0 {
		msg += "; not installed (its policies are generated once it is): " + JoinEngines(a.Missing)
	}
	if len(a.Disabled) > 0 {
		msg += "; disabled by --intents-engines: " + JoinEngines(a.Disabled)
	}
	if len(a.Shadowed) > 0 {
		msg += "; an earlier rule of the same intent id makes " + strings.Join(a.Shadowed, ", ")
	}
	if len(unenforced) > 0 {
		msg += "; no engine implements " + strings.Join(unenforced, ", ") + ": nothing enforces it"
	}
	return msg
}

// OnlyCreated reports whether every change made a policy (none reverted or deleted).
func (a Applied) OnlyCreated() bool {
	for _, c := range a.Changes {
		if !strings.HasPrefix(c, "created ") {
			return false
		}
	}
	return true
}
