// Package api holds Quartermaster's API groups, one folder per group and version
// (api/<group>/v1alpha1). Types carry kubebuilder markers only; no logic lives here.
package api
