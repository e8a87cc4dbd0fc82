// Command kubeclient is what a CI job does with the kubeconfig a namespace request hands out, run
// as a Pod on the real node (test/realnode): with the kubeconfig's credentials and server, it
// creates a Deployment in the namespace it was given (which must succeed) and the same in another
// (which must be refused), and prints what the API server answered.
//
//	kubeclient --kubeconfig /etc/kubeconfig/kubeconfig --namespace NS --other OTHER
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the handed-out kubeconfig")
	namespace := flag.String("namespace", "", "the namespace it was handed out for")
	other := flag.String("other", "", "a namespace it must not reach")
	flag.Parse()
	if err := run(*kubeconfig, *namespace, *other); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, namespace, other string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	fmt.Println("server:", cfg.Host)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if _, err := cs.AppsV1().Deployments(namespace).Create(ctx, deployment(), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating a Deployment in %s: %w", namespace, err)
	}
	fmt.Printf("created deployment %s/app\n", namespace)
	_, err = cs.AppsV1().Deployments(other).Create(ctx, deployment(), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		return fmt.Errorf("creating a Deployment in %s: want Forbidden, got %w", other, err)
	}
	fmt.Printf("refused in %s: %v\n", other, err)
	return nil
}

func deployment() *appsv1.Deployment {
	labels := map[string]string{"app": "app"}
	one := int32(1)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "app", Image: "docker.io/local/pause:1", ImagePullPolicy: corev1.PullNever,
				}}},
			},
		},
	}
}
