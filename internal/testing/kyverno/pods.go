package kyverno

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// Image is the image StartPods makes of the two binaries hack/kyverno-bin.sh builds.
const Image = "docker.io/local/kyverno:" + Version

// ServiceName is the admission controller's Service, through which the API server calls its
// webhooks (the chart's kyverno-svc, port 443 to the Pods' 9443).
const ServiceName = "kyverno-svc"

// Pods is Kyverno running as its Helm chart runs it, on a cluster with a real node: the admission
// and background controllers as Deployments of an image made from the binaries of the cache, its
// webhooks registered by Service.
type Pods struct {
	t  TB
	c  client.Client
	cs *kubernetes.Clientset
}

// StartPods installs Kyverno's CRDs, the chart's RBAC and ConfigMaps, makes the image (a
// docker-archive of both binaries, hack/node-image) and hands it to load (which puts it on the
// node), then runs both controllers as Deployments under the chart's securityContext and waits
// until the API server calls the policy webhook through the Service. Stop (at the test's end)
// deletes the Deployments and the webhook configurations.
func StartPods(t TB, admin *rest.Config, load func(archive string) error) *Pods {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	k := &Pods{t: t, c: newClient(t, admin), cs: cs}
	t.Cleanup(k.Stop)
	archive := filepath.Join(t.TempDir(), "kyverno.tar")
	cmd := exec.Command("go", "run", "./hack/node-image", "--out", archive, "--ref", Image, "--entrypoint", "/kyverno",
		"--user", "65534:65534",
		"--file", filepath.Join(bin, "kyverno")+"=/kyverno", "--file", filepath.Join(bin, "background-controller")+"=/background-controller")
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("making Kyverno's image: %v\n%s", err, out)
	}
	if err := load(archive); err != nil {
		t.Fatalf("loading Kyverno's image: %v", err)
	}
	ctx := context.Background()
	installCRDs(t, k.c, bin)
	for _, obj := range append(installObjects(chartNamespaces()), podObjects()...) {
		if err := apply(ctx, k.c, obj); err != nil {
			t.Fatalf("installing %T %s: %v", obj, obj.GetName(), err)
		}
	}
	probe := probePolicy()
	poll(t, "Kyverno's Pods to serve its policy webhook through "+ServiceName, func(ctx context.Context) (bool, string) {
		if msg := k.stuck(ctx); msg != "" {
			t.Fatal(msg)
		}
		err := k.c.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if err == nil {
			return false, "the probe policy was admitted"
		}
		return strings.Contains(err.Error(), `admission webhook "validate-policy.kyverno.svc" denied the request`), err.Error()
	})
	// Every webhook goes through the Service, none by URL.
	vwcs, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: WebhookLabel})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range vwcs.Items {
		for _, h := range w.Webhooks {
			if s := h.ClientConfig.Service; s == nil || s.Name != ServiceName || s.Namespace != Namespace {
				t.Fatalf("webhook %s of %s is not called through the Service %s: %+v", h.Name, w.Name, ServiceName, h.ClientConfig)
			}
		}
	}
	// The background controller's RBAC is in force (it writes what generate rules make).
	waitAllowed(t, k.c, BackgroundServiceAccount, authorizationv1.ResourceAttributes{Group: "kyverno.io", Resource: "updaterequests", Verb: "watch"})
	return k
}

// WaitPolicyReady waits until Kyverno reports the policy ready (namespace "" for a ClusterPolicy).
func (k *Pods) WaitPolicyReady(t TB, namespace, name string) {
	t.Helper()
	WaitPolicyReady(t, k.c, namespace, name)
}

// stuck names a Kyverno container that cannot start (its image, a crash), "" otherwise.
func (k *Pods) stuck(ctx context.Context) string {
	pods, err := k.cs.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	for _, p := range pods.Items {
		for _, s := range p.Status.ContainerStatuses {
			if w := s.State.Waiting; w != nil && (w.Reason == "CrashLoopBackOff" || w.Reason == "ErrImageNeverPull" || strings.Contains(w.Reason, "Err")) {
				return fmt.Sprintf("Kyverno's pod %s: %s: %s", p.Name, w.Reason, w.Message)
			}
		}
	}
	return ""
}

// Stop deletes the Deployments and Kyverno's webhook configurations, whose failurePolicy Fail would
// refuse every matching request once no Pod answers.
func (k *Pods) Stop() {
	ctx := context.Background()
	var errs []error
	for _, d := range []string{AdmissionDeployment, BackgroundDeployment} {
		if err := k.cs.AppsV1().Deployments(Namespace).Delete(ctx, d, metav1.DeleteOptions{}); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
		}
	}
	sel := metav1.ListOptions{LabelSelector: WebhookLabel}
	if err := k.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		errs = append(errs, err)
	}
	if err := k.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		k.t.Errorf("stopping Kyverno: %v", err)
	}
}

// podObjects are the chart's Service and Deployments of the two controllers (its default values:
// one replica each, the chart's securityContext, probes and environment).
func podObjects() []client.Object {
	admissionLabels, backgroundLabels := componentLabels("admission-controller"), componentLabels("background-controller")
	env := func(serviceAccount, deployment string) []corev1.EnvVar {
		field := func(name, path string) corev1.EnvVar {
			return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
		}
		return []corev1.EnvVar{
			{Name: "KYVERNO_SERVICEACCOUNT_NAME", Value: serviceAccount},
			{Name: "INIT_CONFIG", Value: ConfigMapName},
			{Name: "METRICS_CONFIG", Value: MetricsConfigMapName},
			field("KYVERNO_NAMESPACE", "metadata.namespace"),
			field("KYVERNO_POD_NAME", "metadata.name"),
			{Name: "KYVERNO_DEPLOYMENT", Value: deployment},
			{Name: "KYVERNO_SVC", Value: ServiceName},
			{Name: "TUF_ROOT", Value: "/.sigstore"},
		}
	}
	securityContext := &corev1.SecurityContext{
		RunAsNonRoot: ptr.To(true), Privileged: ptr.To(false), AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem: ptr.To(true), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	scratch := []corev1.Volume{{Name: "sigstore", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mounts := []corev1.VolumeMount{{Name: "sigstore", MountPath: "/.sigstore"}}
	deployment := func(name, serviceAccount string, labels map[string]string, container corev1.Container) *appsv1.Deployment {
		container.Image, container.ImagePullPolicy = Image, corev1.PullNever
		container.Env, container.SecurityContext, container.VolumeMounts = env(serviceAccount, name), securityContext, mounts
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						ServiceAccountName: serviceAccount, Containers: []corev1.Container{container}, Volumes: scratch,
					},
				},
			},
		}
	}
	return []client.Object{
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: ServiceName, Namespace: Namespace, Labels: admissionLabels},
			Spec: corev1.ServiceSpec{
				Selector: admissionLabels,
				Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https"), Protocol: corev1.ProtocolTCP}},
			},
		},
		deployment(AdmissionDeployment, AdmissionServiceAccount, admissionLabels, corev1.Container{
			Name: "kyverno",
			Args: []string{
				"--caSecretName=" + CASecretName, "--tlsSecretName=" + TLSSecretName,
				"--backgroundServiceAccountName=system:serviceaccount:" + Namespace + ":" + BackgroundServiceAccount,
				"--servicePort=443", "--webhookServerPort=9443", "--disableLogColor=true",
			},
			Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 9443, Protocol: corev1.ProtocolTCP}},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health/readiness", Port: intstr.FromInt32(9443), Scheme: corev1.URISchemeHTTPS}},
				PeriodSeconds: 2,
			},
		}),
		deployment(BackgroundDeployment, BackgroundServiceAccount, backgroundLabels, corev1.Container{
			Name: "controller", Command: []string{"/background-controller"}, Args: []string{"--disableLogColor=true"},
		}),
	}
}
