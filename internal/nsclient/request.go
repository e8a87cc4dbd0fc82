// Package nsclient is the pipeline's side of a namespace request: it creates (or reuses) the
// request ConfigMap, waits for the namespaces controller's answer, and writes the kubeconfig it
// hands out. It needs only what config/samples/namespaces/pipeline-rbac.yaml grants: create, get
// and delete of ConfigMaps and get of Secrets in the requests namespace (no list, no watch).
package nsclient

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// Request is what a pipeline asks for.
type Request struct {
	Name              string
	RequestsNamespace string
	TTL               time.Duration // 0: the operator's default (no expiry)
	TokenTTL          time.Duration // 0: the operator's --token-ttl
	Timeout           time.Duration // how long to wait for the answer
	KubeconfigPath    string        // where the kubeconfig is written (mode 0600)
}

// Refused is the controller's final answer to a request it will not serve as it stands (Invalid
// or Conflict): waiting longer would not change it.
type Refused struct {
	Status  nsrequest.Status
	Reason  string
	Message string
}

func (r *Refused) Error() string {
	return fmt.Sprintf("the request is %s (%s): %s", r.Status, r.Reason, r.Message)
}

// Served is what a Ready request handed out.
type Served struct {
	Namespace      string
	TokenExpiresAt string
}

// The first answer is asked for quickly (a request is usually served within tens of
// milliseconds), then less often: the pipeline may get, not watch.
const (
	firstPoll = 50 * time.Millisecond
	maxPoll   = 2 * time.Second
)

// Run creates or reuses the request, waits until the controller answers, and writes the
// kubeconfig. A refusal returns *Refused at once; a timeout returns the last status seen.
// Progress lines go to log.
func Run(ctx context.Context, c client.Client, r Request, log io.Writer) (*Served, error) {
	data := map[string]string{}
	if r.TTL > 0 {
		data[nsrequest.DataTTL] = r.TTL.String()
	}
	if r.TokenTTL > 0 {
		data[nsrequest.DataTokenTTL] = r.TokenTTL.String()
	}
	key := client.ObjectKey{Namespace: r.RequestsNamespace, Name: r.Name}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Data: data}
	err := c.Create(ctx, cm)
	switch {
	case apierrors.IsAlreadyExists(err):
		if err := c.Get(ctx, key, cm); err != nil {
			return nil, fmt.Errorf("reading the existing request %s: %w", key, err)
		}
		if !maps.Equal(cm.Data, data) && len(data) > 0 {
			fmt.Fprintf(log, "request %s exists with data %v; reusing it as it is (delete it to ask with %v)\n", key, cm.Data, data)
		} else {
			fmt.Fprintf(log, "request %s exists; reusing it\n", key)
		}
	case err != nil:
		return nil, fmt.Errorf("creating the request %s: %w", key, err)
	default:
		fmt.Fprintf(log, "request %s created\n", key)
	}

	ctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	var last *corev1.ConfigMap
	for delay := firstPoll; ; delay = min(delay*3/2, maxPoll) {
		got := &corev1.ConfigMap{}
		err := c.Get(ctx, key, got)
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("request %s was deleted while waiting (its namespace was deleted, or someone deleted it)", key)
		}
		if err == nil { // other errors are transient: ask again
			last = got
			status := nsrequest.Status(got.Annotations[nsrequest.AnnotationStatus])
			if status == nsrequest.StatusReady {
				break
			}
			if status == nsrequest.StatusInvalid || status == nsrequest.StatusConflict {
				return nil, &Refused{Status: status, Reason: got.Annotations[nsrequest.AnnotationReason], Message: got.Annotations[nsrequest.AnnotationMessage]}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("request %s not served within %s: %s", key, r.Timeout, describe(last))
		case <-time.After(delay):
		}
	}

	secret := &corev1.Secret{}
	if err := c.Get(ctx, key, secret); err != nil {
		return nil, fmt.Errorf("reading the credentials Secret %s: %w", key, err)
	}
	kubeconfig := secret.Data["kubeconfig"]
	if len(kubeconfig) == 0 {
		return nil, fmt.Errorf("the credentials Secret %s has no kubeconfig", key)
	}
	if err := writeFile(r.KubeconfigPath, kubeconfig); err != nil {
		return nil, err
	}
	return &Served{
		Namespace:      string(secret.Data["namespace"]),
		TokenExpiresAt: secret.Annotations[nsrequest.AnnotationTokenExpiresAt],
	}, nil
}

// describe is the last status seen, for a timeout's error.
func describe(cm *corev1.ConfigMap) string {
	if cm == nil {
		return "the request could not be read"
	}
	status := cm.Annotations[nsrequest.AnnotationStatus]
	if status == "" {
		return "no answer from the namespaces controller yet (is it running, and watching this requests namespace?)"
	}
	return fmt.Sprintf("last status %s (%s): %s", status, cm.Annotations[nsrequest.AnnotationReason], cm.Annotations[nsrequest.AnnotationMessage])
}

// writeFile writes the kubeconfig readable by its owner only, replacing the file at once so a
// reader never sees half of it.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	return nil
}

// ExitCode is the subcommand's exit status for a refusal: 2, where other failures (timeouts, API
// errors) exit with 1, so a pipeline can tell "fix the request" from "try again".
func (r *Refused) ExitCode() int { return 2 }
