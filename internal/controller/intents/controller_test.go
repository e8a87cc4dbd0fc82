package intents

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

func TestEnginesFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flag string
		want []intent.Engine // nil: every engine
		err  string
	}{
		{flag: "all"},
		{flag: ""},
		{flag: "none", want: []intent.Engine{}},
		{flag: "kubearmor, Kyverno,k8tls", want: []intent.Engine{intent.K8TLS, intent.KubeArmor, intent.Kyverno}},
		{flag: "cilium", err: `unknown engine "cilium"`},
		{flag: "kyverno,", err: `unknown engine ""`},
	} {
		got, err := (&Options{Concurrency: 1, Engines: tc.flag}).engines()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one naming %s", tc.flag, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.flag, err)
			continue
		}
		if (tc.want == nil) != (got == nil) {
			t.Errorf("%q: %v, want %v", tc.flag, got, tc.want)
			continue
		}
		if keys := slices.Sorted(maps.Keys(got)); tc.want != nil && !slices.Equal(keys, tc.want) {
			t.Errorf("%q: %v, want %v", tc.flag, keys, tc.want)
		}
	}
}
