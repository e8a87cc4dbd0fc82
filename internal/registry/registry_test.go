package registry

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func controllers() []Controller {
	return []Controller{
		{Name: "a"},
		{Name: "b", Configured: func() error { return errors.New("--b-endpoint is required") }},
		{Name: "c"},
	}
}

func TestSelect(t *testing.T) {
	cases := []struct {
		flag         string
		wantEnabled  string
		wantDisabled string
		wantErr      string
	}{
		{flag: "", wantEnabled: "a,c", wantDisabled: "b"},
		{flag: "c", wantEnabled: "c"},
		{flag: " a , c ", wantEnabled: "a,c"},
		{flag: "a,b", wantErr: "--b-endpoint is required"},
		{flag: "nonsense", wantErr: `unknown controller "nonsense"; valid controllers are: a, b, c`},
	}
	for _, tc := range cases {
		t.Run(tc.flag, func(t *testing.T) {
			sel, err := Select(tc.flag, controllers())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(Names(sel.Enabled), ","); got != tc.wantEnabled {
				t.Errorf("enabled %q, want %q", got, tc.wantEnabled)
			}
			var disabled []string
			for n := range sel.Disabled {
				disabled = append(disabled, n)
			}
			if got := strings.Join(disabled, ","); got != tc.wantDisabled {
				t.Errorf("disabled %q, want %q", got, tc.wantDisabled)
			}
		})
	}
}

func TestCacheOptionsRefusesTwoRestrictionsOfOneKind(t *testing.T) {
	restrict := func() map[client.Object]cache.ByObject {
		return map[client.Object]cache.ByObject{&corev1.Secret{}: {}}
	}
	if _, err := CacheOptions([]Controller{{Name: "a", CacheByObject: restrict}, {Name: "c"}}); err != nil {
		t.Fatal(err)
	}
	_, err := CacheOptions([]Controller{{Name: "a", CacheByObject: restrict}, {Name: "c", CacheByObject: restrict}})
	if err == nil || !strings.Contains(err.Error(), "both restrict") {
		t.Fatalf("err = %v", err)
	}
}
