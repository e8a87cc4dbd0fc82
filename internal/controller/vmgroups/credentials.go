package vmgroups

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// Keys of the vCenter Secret.
const (
	keyHost = "VC_HOST"
	keyUser = "VC_USER"
	keyPass = "VC_PASS"
	// keyCA optionally holds the PEM CA bundle vCenter's certificate is verified against.
	keyCA = "VC_CA"
)

// credentials reads the vCenter Secret (from its own cache: a rotated Secret is picked up at once,
// as its change triggers a reconcile). Errors name keys, never values.
func (r *Reconciler) credentials(ctx context.Context) (vcenter.Credentials, error) {
	s := &corev1.Secret{}
	if err := r.Secrets.Get(ctx, r.Secret, s); err != nil {
		if apierrors.IsNotFound(err) {
			return vcenter.Credentials{}, fmt.Errorf("vCenter Secret %s (--vsphere-secret) not found", r.Secret)
		}
		return vcenter.Credentials{}, fmt.Errorf("reading the vCenter Secret %s: %w", r.Secret, err)
	}
	var missing []string
	for _, k := range []string{keyHost, keyUser, keyPass} {
		if len(s.Data[k]) == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return vcenter.Credentials{}, fmt.Errorf("vCenter Secret %s lacks %s", r.Secret, strings.Join(missing, ", "))
	}
	u, err := vsphere.ServerURL(string(s.Data[keyHost]))
	if err != nil {
		return vcenter.Credentials{}, fmt.Errorf("vCenter Secret %s: %w", r.Secret, err)
	}
	return vcenter.Credentials{
		Server: u,
		User:   strings.TrimSpace(string(s.Data[keyUser])),
		// Only a trailing newline is trimmed (files made with echo): a password may end with spaces.
		Password: strings.TrimRight(string(s.Data[keyPass]), "\r\n"),
		Insecure: r.Insecure,
		CAPEM:    s.Data[keyCA],
	}, nil
}

// connect returns the shared vCenter session, or why there is none.
func (r *Reconciler) connect(ctx context.Context) (vcenter.API, *failure) {
	creds, err := r.credentials(ctx)
	if err != nil {
		return nil, &failure{Outcome: status.WaitsForPerson("CredentialsUnavailable", err.Error(), r.SlowRetry)}
	}
	api, err := r.Connector.Get(ctx, creds)
	if err != nil {
		if vcenter.IsLoginRefused(err) {
			return nil, &failure{Outcome: status.WaitsForPerson("LoginFailed",
				fmt.Sprintf("vCenter refused the user name or password of Secret %s (%v)", r.Secret, err), r.SlowRetry)}
		}
		return nil, vcenterFailure(err)
	}
	return api, nil
}
