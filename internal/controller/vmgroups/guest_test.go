package vmgroups

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"testing"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// waitStalled waits until the group is Stalled for reason with a message containing message.
func (f *fixture) waitStalled(t *testing.T, ns, name, reason, message string) *computev1alpha1.VmGroup {
	t.Helper()
	var vg *computev1alpha1.VmGroup
	testenv.Eventually(t, name+" stalled: "+reason, func() (bool, string) {
		vg = f.get(t, ns, name)
		st := vg.Status
		stalled := meta.FindStatusCondition(st.Conditions, computev1alpha1.ConditionStalled)
		return stalled != nil && stalled.Status == metav1.ConditionTrue && stalled.Reason == reason &&
				strings.Contains(st.LastMessage, message) && st.ObservedGeneration == vg.Generation,
			fmt.Sprintf("%s %+v: %s", st.Phase, stalled, st.LastMessage)
	})
	return vg
}

// testReplicasCap: spec.replicas is capped at admission (1000), and by the operator's
// --vsphere-max-replicas (20 in these tests): above it the group stalls, naming the flag, and
// nothing is cloned or removed.
func testReplicasCap(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-cap")
	vg := f.group(t, "t-cap", "web", 2, 1, 1, "tmpl-a")
	f.waitRunning(t, "t-cap", "web", 2)

	scale := func(n int32) error {
		return f.c.SubResource("scale").Update(ctx, vg, client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: n}}))
	}
	if err := scale(1001); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "1000") {
		t.Errorf("scaling to 1001 = %v, want Invalid naming the maximum 1000", err)
	}
	clones := f.calls.Calls()["CloneVM_Task"]
	must(t, scale(21))
	got := f.waitStalled(t, "t-cap", "web", "TooManyReplicas", "--vsphere-max-replicas")
	if got.Status.Phase != computev1alpha1.PhaseError {
		t.Errorf("phase = %s, want Error", got.Status.Phase)
	}
	if n := f.calls.Calls()["CloneVM_Task"] - clones; n != 0 {
		t.Errorf("%d clones above the limit, want none", n)
	}
	if vms := f.sim.VMs(t, "/DC0/vm/t-cap-web"); len(vms) != 2 {
		t.Errorf("%d VMs in the folder, want the 2 there were", len(vms))
	}
	f.waitEvent(t, vg, "TooManyReplicas")
	must(t, scale(3))
	f.waitRunning(t, "t-cap", "web", 3)
}

// testGuestReadiness: a VM is ready once powered on and its guest reports an address (or, with
// readiness PowerState, once powered on); the status lists the addresses.
func testGuestReadiness(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-ready")
	f.sim.Guests.Pause()
	resumed := false
	defer func() {
		if !resumed {
			f.sim.Guests.Resume(ctx)
		}
	}()
	vg := f.group(t, "t-ready", "db", 2, 1, 1, "tmpl-a")
	testenv.Eventually(t, "both VMs on, waiting for their guests", func() (bool, string) {
		vg = f.get(t, "t-ready", "db")
		st := vg.Status
		ready := meta.FindStatusCondition(st.Conditions, computev1alpha1.ConditionReady)
		return st.CurrentReplicas == 2 && st.ReadyReplicas == 0 && st.Ready == "0/2" && ready != nil &&
				ready.Status == metav1.ConditionFalse && ready.Reason == "WaitingForGuest" &&
				strings.Contains(st.LastMessage, "db-0, db-1 to report an IP address"),
			fmt.Sprintf("%+v %+v", st, ready)
	})
	for _, v := range vg.Status.VMs {
		if v.PowerState != "poweredOn" || v.Ready || v.IP != "" {
			t.Errorf("status.vms: %+v, want powered on, not ready, no address", v)
		}
	}

	// readiness: PowerState does not wait for the guest.
	power := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t-ready", Name: "appliance"},
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "tmpl-a", Replicas: ptr.To[int32](1),
			Readiness: computev1alpha1.ReadinessPowerState},
	}
	must(t, f.c.Create(ctx, power))
	f.waitRunning(t, "t-ready", "appliance", 1)

	f.sim.Guests.Resume(ctx)
	resumed = true
	vg = f.waitRunning(t, "t-ready", "db", 2)
	if vg.Status.Ready != "2/2" {
		t.Errorf("status.ready = %q, want 2/2", vg.Status.Ready)
	}
	for _, v := range vg.Status.VMs {
		if !v.Ready || v.IP == "" || len(v.IPAddresses) == 0 || v.IPAddresses[0] != v.IP {
			t.Errorf("status.vms: %+v, want ready with its addresses", v)
		}
	}
}

// testGracefulShutdown: removing a VM asks its guest to shut down and powers it off hard only
// when the guest does not within spec.shutdownTimeout, or has no VMware Tools.
func testGracefulShutdown(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-stop")
	vg := f.group(t, "t-stop", "app", 3, 1, 1, "tmpl-a")
	f.update(t, "t-stop", "app", func(s *computev1alpha1.VmGroupSpec) { s.ShutdownTimeout = &metav1.Duration{Duration: 2 * time.Second} })
	f.waitRunning(t, "t-stop", "app", 3)
	folder := "/DC0/vm/t-stop-app"
	counts := func() (shutdowns, powerOffs int) {
		c := f.calls.Calls()
		return c["ShutdownGuest"], c["PowerOffVM_Task"]
	}
	step := func(name string, replicas int32, wantShutdowns, wantPowerOffs int) {
		t.Helper()
		s0, p0 := counts()
		f.update(t, "t-stop", "app", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To(replicas) })
		f.waitRunning(t, "t-stop", "app", replicas)
		s1, p1 := counts()
		if s1-s0 != wantShutdowns || p1-p0 != wantPowerOffs {
			t.Errorf("%s: %d guest shutdowns and %d hard power-offs, want %d and %d", name, s1-s0, p1-p0, wantShutdowns, wantPowerOffs)
		}
	}

	// app-2's guest has no VMware Tools: powered off at once.
	f.sim.Guests.StopTools(t, folder+"/app-2")
	testenv.Eventually(t, "app-2 without tools", func() (bool, string) {
		for _, v := range f.get(t, "t-stop", "app").Status.VMs {
			if v.Name == "app-2" {
				return v.IP == "", v.IP
			}
		}
		return false, "no app-2"
	})
	step("no tools", 2, 0, 1)

	// app-1's guest ignores the request (which the fault keeps from the call counter): powered off
	// hard after the timeout, with a Warning.
	f.faults.Set(&vsimtest.Rule{Kinds: []vsimtest.Kind{vsimtest.Ignore}, Methods: []string{"ShutdownGuest"}, Fraction: 1})
	start := time.Now()
	step("guest ignoring the request", 1, 0, 1)
	if n := f.faults.Injected(); n != 1 {
		t.Errorf("the guest was asked %d times to shut down, want once", n)
	}
	f.faults.Set(nil)
	if waited := time.Since(start); waited < 2*time.Second {
		t.Errorf("powered off hard after %s, before the 2s timeout", waited)
	}
	e := f.waitEvent(t, vg, "ShutdownTimedOut")
	if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, "app-1 did not shut down within 2s") {
		t.Errorf("Event %s %q", e.Type, e.Note)
	}

	// app-0's guest shuts down when asked, also when the group is deleted: no hard power-off.
	s0, p0 := counts()
	must(t, f.c.Delete(ctx, vg))
	testenv.Eventually(t, "the group gone", func() (bool, string) {
		err := f.c.Get(ctx, client.ObjectKeyFromObject(vg), &computev1alpha1.VmGroup{})
		return apierrors.IsNotFound(err), testenv.ErrString(err)
	})
	if s1, p1 := counts(); s1-s0 != 1 || p1-p0 != 0 {
		t.Errorf("deletion: %d guest shutdowns and %d hard power-offs, want 1 and 0", s1-s0, p1-p0)
	}
}

// testFirstBoot: user data from a Secret and metadata from the spec reach each VM through
// guestinfo, with the VM's name as its host name; a missing Secret stalls the group before any VM
// is touched; new data replaces the VMs.
func testFirstBoot(t *testing.T, f *fixture) {
	ctx := context.Background()
	const ns = "t-boot"
	f.namespace(t, ns)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "boot"},
		Data: map[string][]byte{"userData": []byte("#cloud-config\nruncmd: [echo one]\n")}}

	clones := f.calls.Calls()["CloneVM_Task"]
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "node"},
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "tmpl-a", Replicas: ptr.To[int32](2),
			UserData: &computev1alpha1.UserDataSource{SecretName: "boot"},
			Metadata: &runtime.RawExtension{Raw: []byte(`{"network":{"version":2},"local-hostname":"ignored"}`)}},
	}
	must(t, f.c.Create(ctx, vg))
	f.waitStalled(t, ns, "node", "UserDataNotFound", "Secret t-boot/boot (spec.userData) does not exist")
	if n := f.calls.Calls()["CloneVM_Task"] - clones; n != 0 || f.sim.Exists(t, "/DC0/vm/t-boot-node") {
		t.Errorf("%d clones (and the folder made) before the user data exists", n)
	}

	secret.Data = map[string][]byte{"other": []byte("x")}
	must(t, f.c.Create(ctx, secret))
	f.waitStalled(t, ns, "node", "UserDataNotFound", `has no key "userData"`)

	secret.Data = map[string][]byte{"userData": []byte("#cloud-config\nruncmd: [echo one]\n")}
	must(t, f.c.Update(ctx, secret))
	f.waitRunning(t, ns, "node", 2)
	check := func(userData string) (bool, string) {
		vms, err := f.sim.ListVMs(ctx, "/DC0/vm/t-boot-node")
		if err != nil {
			return false, err.Error()
		}
		for _, name := range []string{"node-0", "node-1"} {
			x := vms[name].ExtraConfig
			ud, _ := base64.StdEncoding.DecodeString(x["guestinfo.userdata"])
			md, _ := base64.StdEncoding.DecodeString(x["guestinfo.metadata"])
			var meta map[string]any
			_ = json.Unmarshal(md, &meta)
			switch {
			case string(ud) != userData || x["guestinfo.userdata.encoding"] != "base64":
				return false, fmt.Sprintf("%s user data %q", name, ud)
			case meta["local-hostname"] != name || meta["instance-id"] != name || meta["network"] == nil ||
				x["guestinfo.metadata.encoding"] != "base64":
				return false, fmt.Sprintf("%s metadata %s", name, md)
			case x[vsphere.KeyBoot] == "" || strings.Contains(x[vsphere.KeyBoot], "cloud-config"):
				return false, fmt.Sprintf("%s boot mark %q", name, x[vsphere.KeyBoot])
			}
		}
		return true, ""
	}
	if ok, why := check("#cloud-config\nruncmd: [echo one]\n"); !ok {
		t.Error(why)
	}

	// New user data replaces the VMs, one at a time (picked up at the next resync).
	secret.Data["userData"] = []byte("#cloud-config\nruncmd: [echo two]\n")
	must(t, f.c.Update(ctx, secret))
	testenv.Eventually(t, "both VMs replaced with the new user data", func() (bool, string) {
		return check("#cloud-config\nruncmd: [echo two]\n")
	})
	f.waitRunning(t, ns, "node", 2)
	f.waitEvent(t, vg, "VMReplaced")
}
