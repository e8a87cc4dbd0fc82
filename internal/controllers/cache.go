package controllers

import (
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
)

// AddCache adds a controller's own cache (one beside the manager's shared cache, e.g. of the
// objects it owns in one namespace) to mgr, started with the manager whether or not it leads.
//
// The manager warms its controllers up before it leads (EnableWarmup): their sources start in a
// standby and wait for their caches. controller-runtime v0.24 starts a cache in a standby only if it
// says it needs no leader election, which its plain cache does but the cache cache.New returns for
// DefaultNamespaces or per-object namespaces (a multi-namespace or by-kind cache) does not: added
// with mgr.Add it started only once its manager led, a standby's sources on it timed out
// (CacheSyncTimeout, 2 minutes) and the standby exited, again and again. Seen on a real node, where
// the chart's second replica restarted every two minutes.
func AddCache(mgr ctrl.Manager, c cache.Cache) error { return mgr.Add(standbyCache{c}) }

// standbyCache runs in every replica (the manager's "others" group), not only the leader.
type standbyCache struct{ cache.Cache }

func (standbyCache) NeedLeaderElection() bool { return false }
