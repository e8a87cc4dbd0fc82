package vmgroups

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testDataDisks: a group's VMs get their data disks beside the template's; a larger size grows
// them in place (reconfigured one at a time, not cloned again); a new disk replaces the VMs; the
// API server refuses a smaller size and a new datastore for a disk.
func testDataDisks(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-disks")
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t-disks", Name: "store"},
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "tmpl-a", Replicas: ptr.To[int32](2),
			Readiness: computev1alpha1.ReadinessPowerState, Disks: []computev1alpha1.DataDisk{{Name: "data", SizeGiB: 10}}},
	}
	must(t, f.c.Create(ctx, vg))
	f.waitRunning(t, "t-disks", "store", 2)
	base := f.sim.Disks(t, "tmpl-a")
	wantDisks := func(extra ...int64) {
		t.Helper()
		want := fmt.Sprint(append(append([]int64{}, base...), extra...))
		testenv.Eventually(t, "disks "+want, func() (bool, string) {
			var got []string
			for _, vm := range []string{"store-0", "store-1"} {
				disks, err := f.sim.DisksOf(ctx, "/DC0/vm/t-disks-store/"+vm) // gone while it is replaced
				if err != nil {
					return false, err.Error()
				}
				got = append(got, fmt.Sprint(disks))
			}
			return got[0] == want && got[1] == want, strings.Join(got, " ")
		})
	}
	wantDisks(10)

	full, linked := f.sim.Clones()
	f.update(t, "t-disks", "store", func(s *computev1alpha1.VmGroupSpec) { s.Disks[0].SizeGiB = 20 })
	wantDisks(20)
	f.waitRunning(t, "t-disks", "store", 2)
	if fl, ln := f.sim.Clones(); fl != full || ln != linked {
		t.Errorf("growing a disk cloned %d VMs; want none (grown in place)", fl+ln-full-linked)
	}
	e := f.waitEvent(t, vg, "VMReconfigured")
	if !strings.Contains(e.Note, "disk data 10 → 20 GiB") {
		t.Errorf("VMReconfigured note %q, want the disk's growth", e.Note)
	}

	for _, c := range []struct {
		name   string
		change func(*computev1alpha1.DataDisk)
		reject string
	}{
		{"shrink", func(d *computev1alpha1.DataDisk) { d.SizeGiB = 5 }, "a data disk cannot shrink"},
		{"new datastore", func(d *computev1alpha1.DataDisk) { d.Datastore = "LocalDS_0" }, "a data disk's datastore is fixed"},
	} {
		got := f.get(t, "t-disks", "store")
		c.change(&got.Spec.Disks[0])
		if err := f.c.Update(ctx, got); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.reject) {
			t.Errorf("%s: %v, want Invalid with %q", c.name, err, c.reject)
		}
	}

	f.update(t, "t-disks", "store", func(s *computev1alpha1.VmGroupSpec) {
		s.Disks = append(s.Disks, computev1alpha1.DataDisk{Name: "logs", SizeGiB: 2})
	})
	wantDisks(20, 2)
	f.waitRunning(t, "t-disks", "store", 2)
	if fl, ln := f.sim.Clones(); fl+ln-full-linked != 2 {
		t.Errorf("a new disk made %d clones; want the 2 VMs replaced", fl+ln-full-linked)
	}
}
