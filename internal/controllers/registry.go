// Package controllers describes the controllers the Quartermaster manager can host, chooses which of
// them run from the --controllers flag and their configuration, and starts each one only once the
// API kinds it needs are served.
package controllers

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
)

// Controller is one controller the manager can run. Each controller package returns one from a
// constructor; cmd/quartermaster lists them.
type Controller struct {
	// Name is what --controllers selects it by, e.g. "namespaces".
	Name string
	// Requires lists the custom resource kinds the controller watches. Until every one of them is
	// served the controller waits instead of failing (built-in kinds need not be listed).
	Requires []schema.GroupVersionKind
	// AddFlags registers the controller's own flags. Optional.
	AddFlags func(fs *flag.FlagSet)
	// Configured reports, after flags are parsed, why the controller cannot run (an error that
	// names the missing or invalid flag), or nil. Optional.
	Configured func() error
	// CacheByObject narrows what the shared cache holds for the kinds this controller watches
	// (label or field selectors). Optional; consulted only when the controller is enabled.
	CacheByObject func() map[client.Object]cache.ByObject
	// NoNamespaceIndex lists kinds the controller caches and never lists by namespace from the
	// cache. Their informers are built without client-go's per-namespace index (one small set per
	// namespace that has such an object: about 250 bytes each), unless another enabled controller
	// names the kind in its CacheByObject without listing it here too. A List by namespace of such a
	// kind from the cache fails ("Index with name namespace does not exist"). Optional.
	NoNamespaceIndex []client.Object
	// Setup registers the controller with the manager. It runs once, after Requires are served;
	// kinds is the manager's one follower of what is served later (watches of kinds that may be
	// served after the controller started are built as its Late sources).
	Setup func(mgr ctrl.Manager, kinds *Kinds) error
	// Readyz, when set, is part of the manager's /readyz (as check Name): whether what the
	// controller serves to clients (not to the API server) answers yet. It is registered before
	// the manager starts (Setup runs after, when no check can be added any more) and must say
	// "not ready" until Setup has started what it checks.
	Readyz func(*http.Request) error
}

// Selection is the outcome of choosing controllers: the ones to run, and the ones left off with why.
type Selection struct {
	Enabled  []Controller
	Disabled map[string]error
}

// Names returns the names of the controllers, in order.
func Names(all []Controller) []string {
	names := make([]string, 0, len(all))
	for _, c := range all {
		names = append(names, c.Name)
	}
	return names
}

// Select chooses the controllers to run from a --controllers value (a comma list; empty means every
// controller). An unknown name is an error that lists the valid ones. A controller that is not
// configured is left off when it was chosen implicitly, and is an error when it was named.
func Select(flagValue string, all []Controller) (Selection, error) {
	sel := Selection{Disabled: map[string]error{}}
	named := map[string]bool{}
	for _, n := range strings.Split(flagValue, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.ContainsFunc(all, func(c Controller) bool { return c.Name == n }) {
			return sel, fmt.Errorf("--controllers: unknown controller %q; valid controllers are: %s",
				n, validList(all))
		}
		named[n] = true
	}
	var errs []error
	for _, c := range all {
		if len(named) > 0 && !named[c.Name] {
			continue
		}
		if c.Configured != nil {
			if err := c.Configured(); err != nil {
				if named[c.Name] {
					errs = append(errs, fmt.Errorf("controller %q: %w", c.Name, err))
				} else {
					sel.Disabled[c.Name] = err
				}
				continue
			}
		}
		sel.Enabled = append(sel.Enabled, c)
	}
	return sel, errors.Join(errs...)
}

func validList(all []Controller) string {
	if len(all) == 0 {
		return "(none registered)"
	}
	return strings.Join(Names(all), ", ")
}

// CacheOptions merges the ByObject cache restrictions of the enabled controllers. When two
// controllers restrict one kind, the shared informer must hold what either needs: the union of
// their namespaces (all of them when either has none), and a label or field selector or a
// transform only when both have the same one (selectors cannot be ORed in one watch, and a
// transform made for one controller may drop what the other reads). Each widening is returned as
// a note, for the log.
func CacheOptions(enabled []Controller) (map[client.Object]cache.ByObject, []string) {
	merged := map[client.Object]cache.ByObject{}
	byKind := map[string]client.Object{}
	owners := map[string][]string{}
	var notes []string
	for _, c := range enabled {
		if c.CacheByObject == nil {
			continue
		}
		for obj, by := range c.CacheByObject() {
			key := fmt.Sprintf("%T", obj)
			prev, ok := byKind[key]
			if !ok {
				byKind[key], merged[obj], owners[key] = obj, by, []string{c.Name}
				continue
			}
			var widened []string
			merged[prev], widened = mergeByObject(merged[prev], by)
			owners[key] = append(owners[key], c.Name)
			for _, w := range widened {
				notes = append(notes, fmt.Sprintf("controllers %s both restrict the cache of %s: %s",
					strings.Join(owners[key], ", "), key, w))
			}
		}
	}
	return merged, notes
}

// mergeByObject is what two restrictions of one kind share; widened says what either lost.
func mergeByObject(a, b cache.ByObject) (cache.ByObject, []string) {
	var out cache.ByObject
	var widened []string
	if len(a.Namespaces) > 0 && len(b.Namespaces) > 0 {
		out.Namespaces = map[string]cache.Config{}
		for _, m := range []map[string]cache.Config{a.Namespaces, b.Namespaces} {
			for ns, cfg := range m {
				if prev, ok := out.Namespaces[ns]; ok && !reflect.DeepEqual(prev, cfg) {
					cfg = cache.Config{} // two configurations of one namespace: all of it
					widened = append(widened, "namespace "+ns+" is cached whole")
				}
				out.Namespaces[ns] = cfg
			}
		}
	} else if len(a.Namespaces)+len(b.Namespaces) > 0 {
		widened = append(widened, "every namespace is cached")
	}
	switch {
	case a.Label != nil && b.Label != nil && a.Label.String() == b.Label.String():
		out.Label = a.Label
	case a.Label != nil || b.Label != nil:
		widened = append(widened, "no label selector")
	}
	switch {
	case a.Field != nil && b.Field != nil && a.Field.String() == b.Field.String():
		out.Field = a.Field
	case a.Field != nil || b.Field != nil:
		widened = append(widened, "no field selector")
	}
	if a.Transform != nil || b.Transform != nil {
		widened = append(widened, "objects kept whole (but for managedFields)")
	}
	out.UnsafeDisableDeepCopy = a.UnsafeDisableDeepCopy
	if a.UnsafeDisableDeepCopy != nil && b.UnsafeDisableDeepCopy != nil && *a.UnsafeDisableDeepCopy != *b.UnsafeDisableDeepCopy {
		out.UnsafeDisableDeepCopy = nil
	}
	return out, widened
}

// NewInformer is the cache's informer constructor for the enabled controllers: client-go's own,
// without the per-namespace index for the kinds every controller naming them marks
// NoNamespaceIndex.
func NewInformer(enabled []Controller) func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer {
	unindexed := map[reflect.Type]bool{}
	for _, c := range enabled {
		for _, obj := range c.NoNamespaceIndex {
			unindexed[reflect.TypeOf(obj)] = true
		}
	}
	for _, c := range enabled {
		if c.CacheByObject == nil {
			continue
		}
		for obj := range c.CacheByObject() {
			t := reflect.TypeOf(obj)
			if unindexed[t] && !slices.ContainsFunc(c.NoNamespaceIndex, func(o client.Object) bool { return reflect.TypeOf(o) == t }) {
				delete(unindexed, t)
			}
		}
	}
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		if unindexed[reflect.TypeOf(obj)] {
			indexers = maps.Clone(indexers)
			delete(indexers, toolscache.NamespaceIndex)
		}
		return toolscache.NewSharedIndexInformer(lw, obj, resync, indexers)
	}
}

// LogDisabled logs once, per controller left off, why.
func LogDisabled(log logr.Logger, sel Selection) {
	for _, name := range slices.Sorted(maps.Keys(sel.Disabled)) {
		log.Info("controller disabled: not configured", "controller", name, "reason", sel.Disabled[name].Error())
	}
}
