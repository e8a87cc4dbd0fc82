package kyverno

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What Kyverno 1.19.1's Helm chart (charts/kyverno in its module) installs for the admission and
// background controllers, with the chart's default values and release name "kyverno": the same
// names, the same aggregation, the same rules. Written out here (facts from the chart's
// templates/{admission,background,reports}-controller/{clusterrole,role,*binding}.yaml and values.yaml),
// so that a ClusterRole labelled as the chart aggregates (AggregateToBackgroundLabel) reaches
// Kyverno here as it does in a real install.

// Names of the Kyverno install.
const (
	Namespace                = "kyverno"
	AdmissionServiceAccount  = "kyverno-admission-controller"
	BackgroundServiceAccount = "kyverno-background-controller"
	ReportsServiceAccount    = "kyverno-reports-controller"
	// AdmissionDeployment and BackgroundDeployment are the Deployment names Kyverno is told it runs
	// as (KYVERNO_DEPLOYMENT); no Deployment exists: the processes run on the test machine.
	AdmissionDeployment  = "kyverno-admission-controller"
	BackgroundDeployment = "kyverno-background-controller"
	ReportsDeployment    = "kyverno-reports-controller"
	ConfigMapName        = "kyverno"
	MetricsConfigMapName = "kyverno-metrics"
	// The chart's TLS Secret names (--caSecretName, --tlsSecretName); Kyverno creates them.
	CASecretName  = "kyverno-svc.kyverno.svc.kyverno-tls-ca"
	TLSSecretName = "kyverno-svc.kyverno.svc.kyverno-tls-pair"

	admissionRole  = "kyverno:admission-controller"
	backgroundRole = "kyverno:background-controller"
	reportsRole    = "kyverno:reports-controller"
)

// Aggregation labels of the chart's ClusterRoles: a ClusterRole carrying one of these with value
// "true" adds its rules to that controller's ClusterRole.
const (
	AggregateToAdmissionLabel  = "rbac.kyverno.io/aggregate-to-admission-controller"
	AggregateToBackgroundLabel = "rbac.kyverno.io/aggregate-to-background-controller"
	AggregateToReportsLabel    = "rbac.kyverno.io/aggregate-to-reports-controller"
)

var all = []string{"create", "delete", "get", "list", "patch", "update", "watch", "deletecollection"}

func componentLabels(component string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/part-of":   "kyverno",
		"app.kubernetes.io/instance":  "kyverno",
		"app.kubernetes.io/component": component,
	}
}

func rule(groups, resources, verbs []string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: groups, Resources: resources, Verbs: verbs}
}

func saSubject(name string) []rbacv1.Subject {
	return []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: Namespace}}
}

// installObjects are the namespace, ServiceAccounts, RBAC and ConfigMaps (with the webhooks'
// namespaceSelector), in creation order.
func installObjects(webhookNamespaces *metav1.LabelSelector) []client.Object {
	admissionLabels, backgroundLabels, reportsLabels := componentLabels("admission-controller"), componentLabels("background-controller"), componentLabels("reports-controller")
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ExceptionNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: AdmissionServiceAccount, Namespace: Namespace, Labels: admissionLabels}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: BackgroundServiceAccount, Namespace: Namespace, Labels: backgroundLabels}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ReportsServiceAccount, Namespace: Namespace, Labels: reportsLabels}},

		// Admission controller.
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: admissionRole, Labels: admissionLabels},
			AggregationRule: &rbacv1.AggregationRule{ClusterRoleSelectors: []metav1.LabelSelector{
				{MatchLabels: map[string]string{AggregateToAdmissionLabel: "true"}},
				{MatchLabels: admissionLabels},
			}},
		},
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: admissionRole + ":core", Labels: admissionLabels},
			Rules: []rbacv1.PolicyRule{
				rule([]string{"apiextensions.k8s.io"}, []string{"customresourcedefinitions"}, []string{"get"}),
				rule([]string{"admissionregistration.k8s.io"}, []string{"mutatingwebhookconfigurations", "validatingwebhookconfigurations",
					"validatingadmissionpolicies", "validatingadmissionpolicybindings", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"}, all),
				rule([]string{"rbac.authorization.k8s.io"}, []string{"roles", "clusterroles", "rolebindings", "clusterrolebindings"}, []string{"get", "list", "watch"}),
				rule([]string{"kyverno.io"}, []string{"policies", "policies/status", "clusterpolicies", "clusterpolicies/status", "updaterequests",
					"updaterequests/status", "globalcontextentries", "globalcontextentries/status"}, all),
				rule([]string{"kyverno.io"}, []string{"policyexceptions"}, []string{"create", "get", "list", "patch", "update", "watch"}),
				rule([]string{"policies.kyverno.io"}, []string{"validatingpolicies", "validatingpolicies/status", "namespacedvalidatingpolicies",
					"namespacedvalidatingpolicies/status", "imagevalidatingpolicies", "imagevalidatingpolicies/status",
					"namespacedimagevalidatingpolicies", "namespacedimagevalidatingpolicies/status", "generatingpolicies",
					"generatingpolicies/status", "namespacedgeneratingpolicies", "namespacedgeneratingpolicies/status", "mutatingpolicies",
					"mutatingpolicies/status", "namespacedmutatingpolicies", "namespacedmutatingpolicies/status"}, all),
				rule([]string{"policies.kyverno.io"}, []string{"policyexceptions"}, []string{"create", "get", "list", "patch", "update", "watch"}),
				rule([]string{"reports.kyverno.io"}, []string{"ephemeralreports", "clusterephemeralreports"}, all),
				rule([]string{"wgpolicyk8s.io"}, []string{"policyreports", "policyreports/status", "clusterpolicyreports", "clusterpolicyreports/status"}, all),
				rule([]string{"", "events.k8s.io"}, []string{"events"}, []string{"create", "update", "patch"}),
				rule([]string{"authorization.k8s.io"}, []string{"subjectaccessreviews"}, []string{"create"}),
				rule([]string{""}, []string{"configmaps", "namespaces"}, []string{"get", "list", "watch"}),
				rule([]string{"coordination.k8s.io"}, []string{"leases"}, []string{"create", "update", "patch", "get", "list", "watch"}),
			},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: admissionRole, Labels: admissionLabels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: admissionRole},
			Subjects:   saSubject(AdmissionServiceAccount),
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: admissionRole + ":view", Labels: admissionLabels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
			Subjects:   saSubject(AdmissionServiceAccount),
		},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: admissionRole, Namespace: Namespace, Labels: admissionLabels},
			Rules: []rbacv1.PolicyRule{
				rule([]string{""}, []string{"secrets", "serviceaccounts"}, []string{"get", "list", "watch", "patch", "create", "update", "delete"}),
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"},
					ResourceNames: []string{ConfigMapName, MetricsConfigMapName}},
				rule([]string{"coordination.k8s.io"}, []string{"leases"}, []string{"create", "delete", "get", "patch", "update"}),
				rule([]string{"apps"}, []string{"deployments", "deployments/scale"}, []string{"get", "list", "watch", "patch", "update"}),
			},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: admissionRole, Namespace: Namespace, Labels: admissionLabels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: admissionRole},
			Subjects:   saSubject(AdmissionServiceAccount),
		},

		// Background controller.
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: backgroundRole, Labels: backgroundLabels},
			AggregationRule: &rbacv1.AggregationRule{ClusterRoleSelectors: []metav1.LabelSelector{
				{MatchLabels: map[string]string{AggregateToBackgroundLabel: "true"}},
				{MatchLabels: backgroundLabels},
			}},
		},
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: backgroundRole + ":core", Labels: backgroundLabels},
			Rules: []rbacv1.PolicyRule{
				rule([]string{"apiextensions.k8s.io"}, []string{"customresourcedefinitions"}, []string{"get"}),
				rule([]string{"kyverno.io"}, []string{"policies", "policies/status", "clusterpolicies", "clusterpolicies/status", "policyexceptions",
					"updaterequests", "updaterequests/status", "globalcontextentries", "globalcontextentries/status"}, all),
				rule([]string{"policies.kyverno.io"}, []string{"generatingpolicies", "namespacedgeneratingpolicies", "mutatingpolicies",
					"namespacedmutatingpolicies", "policyexceptions"}, all),
				rule([]string{"policies.kyverno.io"}, []string{"policyexceptions"}, []string{"create", "get", "list", "patch", "update", "watch"}),
				rule([]string{""}, []string{"namespaces", "configmaps"}, []string{"get", "list", "watch"}),
				rule([]string{"", "events.k8s.io"}, []string{"events"}, []string{"create", "get", "list", "patch", "update", "watch"}),
				rule([]string{"reports.kyverno.io"}, []string{"ephemeralreports", "clusterephemeralreports"}, all),
				// The chart's backgroundController.rbac.coreClusterRole.extraResources defaults.
				rule([]string{"networking.k8s.io"}, []string{"ingresses", "ingressclasses", "networkpolicies"}, []string{"create", "update", "patch", "delete"}),
				rule([]string{"rbac.authorization.k8s.io"}, []string{"rolebindings", "roles"}, []string{"create", "update", "patch", "delete"}),
				rule([]string{""}, []string{"configmaps", "resourcequotas", "limitranges"}, []string{"create", "update", "patch", "delete"}),
				rule([]string{"resource.k8s.io"}, []string{"resourceclaims", "resourceclaimtemplates"}, []string{"create", "delete", "update", "patch", "deletecollection"}),
			},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: backgroundRole, Labels: backgroundLabels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: backgroundRole},
			Subjects:   saSubject(BackgroundServiceAccount),
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: backgroundRole + ":view", Labels: backgroundLabels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
			Subjects:   saSubject(BackgroundServiceAccount),
		},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: backgroundRole, Namespace: Namespace, Labels: backgroundLabels},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"},
					ResourceNames: []string{ConfigMapName, MetricsConfigMapName}},
				rule([]string{"coordination.k8s.io"}, []string{"leases"}, []string{"create"}),
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"delete", "get", "patch", "update"},
					ResourceNames: []string{"kyverno-background-controller"}},
				rule([]string{""}, []string{"secrets"}, []string{"get", "list", "watch"}),
			},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: backgroundRole, Namespace: Namespace, Labels: backgroundLabels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: backgroundRole},
			Subjects:   saSubject(BackgroundServiceAccount),
		},

		// Reports controller (the chart's features: VAP reports on, MAP reports off; no metering TLS).
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: reportsRole, Labels: reportsLabels},
			AggregationRule: &rbacv1.AggregationRule{ClusterRoleSelectors: []metav1.LabelSelector{
				{MatchLabels: map[string]string{AggregateToReportsLabel: "true"}},
				{MatchLabels: reportsLabels},
			}},
		},
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: reportsRole + ":core", Labels: reportsLabels},
			Rules: []rbacv1.PolicyRule{
				rule([]string{"apiextensions.k8s.io"}, []string{"customresourcedefinitions"}, []string{"get"}),
				rule([]string{""}, []string{"configmaps", "namespaces"}, []string{"get", "list", "watch"}),
				rule([]string{"kyverno.io"}, []string{"globalcontextentries", "globalcontextentries/status", "policyexceptions", "policies", "clusterpolicies"}, all),
				rule([]string{"policies.kyverno.io"}, []string{"validatingpolicies", "validatingpolicies/status", "namespacedvalidatingpolicies",
					"namespacedvalidatingpolicies/status", "imagevalidatingpolicies", "imagevalidatingpolicies/status",
					"namespacedimagevalidatingpolicies", "namespacedimagevalidatingpolicies/status", "generatingpolicies",
					"namespacedgeneratingpolicies", "mutatingpolicies", "namespacedmutatingpolicies"}, all),
				rule([]string{"policies.kyverno.io"}, []string{"policyexceptions", "policyexceptions/status"}, []string{"get", "list", "watch"}),
				rule([]string{"admissionregistration.k8s.io"}, []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"}, []string{"get", "list", "watch"}),
				rule([]string{"reports.kyverno.io"}, []string{"ephemeralreports", "clusterephemeralreports"}, all),
				rule([]string{"wgpolicyk8s.io"}, []string{"policyreports", "policyreports/status", "clusterpolicyreports", "clusterpolicyreports/status"}, all),
				rule([]string{"openreports.io"}, []string{"reports", "reports/status", "clusterreports", "clusterreports/status"}, all),
				rule([]string{"", "events.k8s.io"}, []string{"events"}, []string{"create", "patch"}),
			},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: reportsRole, Labels: reportsLabels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reportsRole},
			Subjects:   saSubject(ReportsServiceAccount),
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: reportsRole + ":view", Labels: reportsLabels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
			Subjects:   saSubject(ReportsServiceAccount),
		},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: reportsRole, Namespace: Namespace, Labels: reportsLabels},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"},
					ResourceNames: []string{ConfigMapName, MetricsConfigMapName}},
				rule([]string{""}, []string{"secrets"}, []string{"get", "list", "watch"}),
				rule([]string{"coordination.k8s.io"}, []string{"leases"}, []string{"create"}),
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"delete", "get", "patch", "update"},
					ResourceNames: []string{"kyverno-reports-controller"}},
			},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: reportsRole, Namespace: Namespace, Labels: reportsLabels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: reportsRole},
			Subjects:   saSubject(ReportsServiceAccount),
		},
	}
	return append(objs, configMaps(webhookNamespaces)...)
}

// resourceFilters are the chart's default config.resourceFilters that apply here (kinds and
// namespaces Kyverno never processes), with its own namespace excluded as excludeKyvernoNamespace
// does.
const resourceFilters = "[*/*,kyverno,*]" +
	"[Event,*,*][*/*,kube-system,*][*/*,kube-public,*][*/*,kube-node-lease,*][Node,*,*][Node/?*,*,*]" +
	"[APIService,*,*][APIService/?*,*,*][TokenReview,*,*][SubjectAccessReview,*,*][SelfSubjectAccessReview,*,*]" +
	"[Binding,*,*][Pod/binding,*,*][ReplicaSet,*,*][ReplicaSet/?*,*,*][EphemeralReport,*,*][ClusterEphemeralReport,*,*]"

// chartNamespaces is the chart's default config.webhooks.namespaceSelector: every namespace but
// kube-system and Kyverno's own (its webhooks' failurePolicy is Fail).
func chartNamespaces() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", Namespace},
	}}}
}

// configMaps are INIT_CONFIG and METRICS_CONFIG with the chart's defaults, the resource webhooks'
// namespaceSelector (config.webhooks) being webhookNamespaces.
func configMaps(webhookNamespaces *metav1.LabelSelector) []client.Object {
	webhooks, err := json.Marshal(map[string]any{"namespaceSelector": webhookNamespaces})
	if err != nil {
		panic(err) // a LabelSelector always marshals
	}
	return []client.Object{
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: Namespace, Labels: componentLabels("config")},
			Data: map[string]string{
				"enableDefaultRegistryMutation": "true",
				"defaultRegistry":               "docker.io",
				"generateSuccessEvents":         "false",
				"excludeGroups":                 "system:nodes",
				"resourceFilters":               resourceFilters,
				"updateRequestThreshold":        "1000",
				"webhooks":                      string(webhooks),
			},
		},
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: MetricsConfigMapName, Namespace: Namespace, Labels: componentLabels("config")},
			Data:       map[string]string{"namespaces": `{"include":[],"exclude":[]}`},
		},
	}
}
