package irsa

import (
	"slices"
	"testing"
	"time"
)

func TestVersionToPrune(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	day := func(n int) time.Time { return t0.Add(time.Duration(n) * 24 * time.Hour) }
	v := func(id string, created time.Time, def bool) PolicyVersion {
		return PolicyVersion{ID: id, Created: created, IsDefault: def}
	}
	for _, tc := range []struct {
		name     string
		versions []PolicyVersion
		want     string
		ok       bool
	}{
		{"none", nil, "", false},
		{"four: room for one more", []PolicyVersion{v("v1", day(1), false), v("v2", day(2), false), v("v3", day(3), false), v("v4", day(4), true)}, "", false},
		{"five: oldest non-default", []PolicyVersion{v("v3", day(3), false), v("v5", day(5), true), v("v2", day(2), false), v("v4", day(4), false), v("v6", day(6), false)}, "v2", true},
		{"default is the oldest", []PolicyVersion{v("v1", day(1), true), v("v2", day(2), false), v("v3", day(3), false), v("v4", day(4), false), v("v5", day(5), false)}, "v2", true},
		{"ties by number, not by string", []PolicyVersion{v("v10", day(1), false), v("v9", day(1), false), v("v11", day(1), false), v("v12", day(2), false), v("v13", day(3), true)}, "v9", true},
		{"more than five (limit raised or stale list)", []PolicyVersion{v("v1", day(1), false), v("v2", day(2), false), v("v3", day(3), false), v("v4", day(4), false), v("v5", day(5), false), v("v6", day(0), true)}, "v1", true},
		{"unnumbered IDs after numbered on a tie", []PolicyVersion{v("x", day(1), false), v("v7", day(1), false), v("v8", day(2), false), v("v9", day(3), false), v("v10", day(4), true)}, "v7", true},
		{"all default (impossible, but no panic)", []PolicyVersion{v("v1", day(1), true), v("v2", day(2), true), v("v3", day(3), true), v("v4", day(4), true), v("v5", day(5), true)}, "", false},
	} {
		id, ok := VersionToPrune(tc.versions)
		if id != tc.want || ok != tc.ok {
			t.Errorf("%s: VersionToPrune = %q, %v; want %q, %v", tc.name, id, ok, tc.want, tc.ok)
		}
	}
}

func TestAttachmentDiff(t *testing.T) {
	const a, b, c, d = "arn:aws:iam::aws:policy/A", "arn:aws:iam::aws:policy/B", "arn:aws:iam::1:policy/C", "arn:aws:iam::1:policy/D"
	for _, tc := range []struct {
		name                   string
		current, desired       []string
		wantAttach, wantDetach []string
	}{
		{"nothing", nil, nil, nil, nil},
		{"in sync, any order", []string{b, a}, []string{a, b}, nil, nil},
		// Sorted by bytes: account IDs sort before "aws".
		{"attach only", []string{a}, []string{c, a, b}, []string{c, b}, nil},
		{"detach only", []string{d, a, c}, []string{a}, nil, []string{c, d}},
		{"both, duplicates dropped", []string{a, d, d}, []string{c, b, c, a}, []string{c, b}, []string{d}},
		{"ARNs compare exactly", []string{"arn:aws:iam::aws:policy/a"}, []string{a}, []string{a}, []string{"arn:aws:iam::aws:policy/a"}},
	} {
		attach, detach := AttachmentDiff(tc.current, tc.desired)
		if !slices.Equal(attach, tc.wantAttach) || !slices.Equal(detach, tc.wantDetach) {
			t.Errorf("%s: AttachmentDiff = %q, %q; want %q, %q", tc.name, attach, detach, tc.wantAttach, tc.wantDetach)
		}
	}
	current := []string{b, a}
	AttachmentDiff(current, []string{a})
	if !slices.Equal(current, []string{b, a}) {
		t.Error("AttachmentDiff changed its input")
	}
}
