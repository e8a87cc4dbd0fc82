package mirrorcache

import (
	"maps"
	"testing"
)

func TestParseRange(t *testing.T) {
	const size = 1000
	for h, want := range map[string]struct {
		from, to int64
		ok       bool
	}{
		"bytes=0-99":     {0, 100, true},
		"bytes=100-":     {100, size, true},
		"bytes=-10":      {990, size, true},
		"bytes=-5000":    {0, size, true},
		"bytes=990-5000": {990, size, true},
		"bytes=999-999":  {999, 1000, true},
		"":               {ok: false},
		"bytes=1000-":    {ok: false}, // past the end: served whole
		"bytes=5-1":      {ok: false},
		"bytes=0-1,5-6":  {ok: false}, // several ranges: served whole
		"items=0-1":      {ok: false},
		"bytes=-0":       {ok: false},
		"bytes=a-b":      {ok: false},
		"bytes=-":        {ok: false},
	} {
		got, ok := parseRange(h, size)
		if ok != want.ok || (ok && (got[0] != want.from || got[1] != want.to)) {
			t.Errorf("parseRange(%q) = %v %v, want [%d %d] %v", h, got, ok, want.from, want.to, want.ok)
		}
	}
}

// FuzzParseRange: a range the cache serves always lies within the content and is not empty.
func FuzzParseRange(f *testing.F) {
	for _, s := range []string{"bytes=0-99", "bytes=-10", "bytes=5-", "bytes=9223372036854775807-"} {
		f.Add(s, int64(100))
	}
	f.Fuzz(func(t *testing.T, h string, size int64) {
		if size <= 0 {
			return
		}
		if r, ok := parseRange(h, size); ok && (r[0] < 0 || r[0] >= r[1] || r[1] > size) {
			t.Fatalf("parseRange(%q, %d) = %v", h, size, r)
		}
	})
}

func TestParseChallenge(t *testing.T) {
	for h, want := range map[string]struct {
		scheme string
		params map[string]string
	}{
		`Bearer realm="https://auth.docker.io/token",service="registry.docker.io"`: {"bearer",
			map[string]string{"realm": "https://auth.docker.io/token", "service": "registry.docker.io"}},
		`Basic realm="upstream"`: {"basic", map[string]string{"realm": "upstream"}},
		`bearer realm="https://a/t", service=x ,scope="repository:a/b:pull,push"`: {"bearer",
			map[string]string{"realm": "https://a/t", "service": "x", "scope": "repository:a/b:pull,push"}},
		`Bearer realm="a\"b"`: {"bearer", map[string]string{"realm": `a"b`}},
		`Bearer`:              {"bearer", map[string]string{}},
	} {
		scheme, params := parseChallenge(h)
		if scheme != want.scheme || !maps.Equal(params, want.params) {
			t.Errorf("parseChallenge(%q) = %q %v, want %q %v", h, scheme, params, want.scheme, want.params)
		}
	}
}
