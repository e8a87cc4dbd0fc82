package vmgroups

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// bootData is what a group's VMs get at first boot through guestinfo, the way cloud-init's VMware
// datasource (and CAPV) expect it: user data and metadata, base64.
type bootData struct {
	userData []byte
	metadata map[string]any
	pool     string // the address pool's fingerprint (vsphere.Pool.Fingerprint); "" without one
}

// guestinfo adds the VM's guestinfo entries to extra. Each VM's metadata names it: instance-id and
// local-hostname are the VM's name; network, when given, is its cloud-init network configuration.
func (b *bootData) guestinfo(vm string, network map[string]any, extra map[string]string) {
	md := maps.Clone(b.metadata)
	if md == nil {
		md = map[string]any{}
	}
	md["instance-id"], md["local-hostname"] = vm, vm
	if network != nil {
		md["network"] = network
	}
	js, _ := json.Marshal(md) // JSON is YAML, which cloud-init reads
	extra["guestinfo.metadata"] = base64.StdEncoding.EncodeToString(js)
	extra["guestinfo.metadata.encoding"] = "base64"
	if len(b.userData) > 0 {
		extra["guestinfo.userdata"] = base64.StdEncoding.EncodeToString(b.userData)
		extra["guestinfo.userdata.encoding"] = "base64"
	}
}

// fingerprint identifies the data (never shows it), so a VM cloned with other data is replaced.
func (b *bootData) fingerprint() string {
	js, _ := json.Marshal(b.metadata) // map keys sorted: stable
	h := sha256.New()
	h.Write(b.userData)
	h.Write([]byte{0})
	h.Write(js)
	if b.pool != "" { // only then: the fingerprints of groups without a pool stay as they were
		h.Write([]byte{0})
		h.Write([]byte(b.pool))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// readBoot reads the group's first-boot data: the user data from its Secret (read directly, never
// cached: the manager may read only the Secrets it is granted), the metadata from the spec. A
// missing or unreadable Secret or key waits for a person.
func (r *Reconciler) readBoot(ctx context.Context, vg *computev1alpha1.VmGroup, pool *vsphere.Pool) (*bootData, *failure) {
	sp := vg.Spec
	if sp.UserData == nil && sp.Metadata == nil && pool == nil {
		return nil, nil
	}
	b := &bootData{}
	if pool != nil {
		b.pool = pool.Fingerprint()
	}
	if sp.Metadata != nil {
		if err := json.Unmarshal(sp.Metadata.Raw, &b.metadata); err != nil {
			return nil, stalled("InvalidMetadata", fmt.Sprintf("spec.metadata is not an object: %v", err))
		}
		if _, ok := b.metadata["network"]; ok && pool != nil {
			return nil, stalled("InvalidMetadata", "spec.metadata sets network, which spec.addressPool writes for each VM: remove one of them")
		}
	}
	if ud := sp.UserData; ud != nil {
		key := ud.Key
		if key == "" {
			key = computev1alpha1.DefaultUserDataKey
		}
		s := &corev1.Secret{}
		err := r.Reader.Get(ctx, types.NamespacedName{Namespace: vg.Namespace, Name: ud.SecretName}, s)
		switch {
		case apierrors.IsNotFound(err):
			return nil, stalled("UserDataNotFound", fmt.Sprintf("Secret %s/%s (spec.userData) does not exist; no VM is changed until it does", vg.Namespace, ud.SecretName))
		case apierrors.IsForbidden(err):
			return nil, stalled("UserDataForbidden", fmt.Sprintf(
				"the operator may not read Secret %s/%s (spec.userData): bind the ClusterRole quartermaster-vmgroups-user-data to its ServiceAccount in namespace %s",
				vg.Namespace, ud.SecretName, vg.Namespace))
		case err != nil:
			return nil, &failure{Outcome: status.Transient("UserDataUnreadable", err.Error(), err)}
		}
		data, ok := s.Data[key]
		if !ok {
			return nil, stalled("UserDataNotFound", fmt.Sprintf("Secret %s/%s has no key %q (spec.userData.key); no VM is changed until it has", vg.Namespace, ud.SecretName, key))
		}
		b.userData = data
	}
	return b, nil
}

func stalled(reason, message string) *failure {
	return &failure{phase: computev1alpha1.PhaseError, Outcome: status.WaitsForPerson(reason, message, 0)}
}
