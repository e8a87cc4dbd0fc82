package kyverno

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// NamespaceLabel is the label that, set to "on" on a namespace (NamespaceLabels), lets the
// webhooks of a Kyverno started with OnlyLabelledNamespaces see that namespace's objects, and a
// Namespace so labelled.
const NamespaceLabel = "kyverno.testing.quartermaster.dev/webhooks"

// NamespaceLabels are the labels of a namespace Kyverno's webhooks see under OnlyLabelledNamespaces.
func NamespaceLabels() map[string]string { return map[string]string{NamespaceLabel: "on"} }

// Option changes how Start configures Kyverno.
type Option func(*options)

type options struct {
	// webhookNamespaces is Kyverno's config.webhooks.namespaceSelector.
	webhookNamespaces *metav1.LabelSelector
}

// OnlyLabelledNamespaces narrows Kyverno's resource webhooks to the namespaces labelled
// NamespaceLabels (and kube-system and Kyverno's own still excluded), through the setting Kyverno
// has for it (its ConfigMap's webhooks.namespaceSelector, the chart's config.webhooks): the
// webhooks Kyverno registers carry the selector itself. Without it Kyverno sees every namespace
// but those two, as its chart installs it. Cluster-scoped objects other than Namespaces are not
// narrowed by a namespaceSelector: the policies of a test that shares its cluster match
// namespaced kinds, or Namespaces by a label of its own.
func OnlyLabelledNamespaces() Option {
	return func(o *options) {
		o.webhookNamespaces.MatchLabels = NamespaceLabels()
	}
}
