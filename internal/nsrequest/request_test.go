package nsrequest

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

func testPolicy(t *testing.T, allow ...string) *Policy {
	t.Helper()
	deny, err := CompilePatterns(DefaultDenyNames)
	if err != nil {
		t.Fatal(err)
	}
	al, err := CompilePatterns(allow)
	if err != nil {
		t.Fatal(err)
	}
	return &Policy{RequestsNamespace: "namespace-requests", OperatorNamespace: "quartermaster-system", CopyFrom: "platform-shared",
		Deny: deny, Allow: al, TokenTTL: 24 * time.Hour, MaxTokenTTL: 48 * time.Hour, MaxTTL: 7 * 24 * time.Hour}
}

func TestParse(t *testing.T) {
	cases := []struct {
		name       string
		data       map[string]string
		allow      []string
		wantReason string
		wantTTL    time.Duration
		wantToken  time.Duration
		wantNote   string
	}{
		{name: "ci-branch-foo", wantToken: 24 * time.Hour},
		{name: "ttl", data: map[string]string{"ttl": "72h"}, wantTTL: 72 * time.Hour, wantToken: 24 * time.Hour},
		{name: "ttl-capped", data: map[string]string{"ttl": "1000h"}, wantTTL: 7 * 24 * time.Hour, wantToken: 24 * time.Hour, wantNote: "ttl 1000h0m0s capped"},
		{name: "token", data: map[string]string{"token-ttl": "1h"}, wantToken: time.Hour},
		{name: "token-capped", data: map[string]string{"token-ttl": "100h"}, wantToken: 48 * time.Hour, wantNote: "token-ttl 100h0m0s capped"},
		{name: "token-raised", data: map[string]string{"token-ttl": "1m"}, wantToken: MinTokenTTL, wantNote: "raised"},
		{name: "kube-system", wantReason: "Denied"},
		{name: "kube-anything", wantReason: "Denied"},
		{name: "kubernetes", wantToken: 24 * time.Hour}, // anchored: kube-.* does not match
		{name: "default", wantReason: "Denied"},
		{name: "namespace-requests", wantReason: "Denied"},
		{name: "quartermaster-system", wantReason: "Denied"},
		{name: "platform-shared", wantReason: "Denied"}, // the copies' sources
		{name: "Upper", wantReason: "InvalidName"},
		{name: "dotted.name", wantReason: "InvalidName"},
		{name: strings.Repeat("a", 64), wantReason: "InvalidName"},
		{name: "bad-ttl", data: map[string]string{"ttl": "tomorrow"}, wantReason: "InvalidTTL"},
		{name: "zero-ttl", data: map[string]string{"ttl": "0s"}, wantReason: "InvalidTTL"},
		{name: "bad-token", data: map[string]string{"token-ttl": "x"}, wantReason: "InvalidTokenTTL"},
		{name: "ci-allowed", allow: []string{"ci-.*"}, wantToken: 24 * time.Hour},
		{name: "prod", allow: []string{"ci-.*"}, wantReason: "NotAllowed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, rej := testPolicy(t, tc.allow...).Parse(tc.name, tc.data)
			if tc.wantReason != "" {
				if rej == nil || rej.Reason != tc.wantReason || rej.Message == "" {
					t.Fatalf("want rejection %s, got %+v %+v", tc.wantReason, req, rej)
				}
				return
			}
			if rej != nil {
				t.Fatalf("rejected: %s", rej.Message)
			}
			if req.TTL != tc.wantTTL || req.TokenTTL != tc.wantToken {
				t.Errorf("ttl %s token %s, want %s %s", req.TTL, req.TokenTTL, tc.wantTTL, tc.wantToken)
			}
			if tc.wantNote != "" && !strings.Contains(strings.Join(req.Notes, ";"), tc.wantNote) {
				t.Errorf("notes %q lack %q", req.Notes, tc.wantNote)
			}
		})
	}
}

func TestCompilePatternsRejectsBadRegex(t *testing.T) {
	if _, err := CompilePatterns([]string{"("}); err == nil {
		t.Fatal("accepted an invalid regular expression")
	}
}

func TestRequestLabelFitsALabelValue(t *testing.T) {
	if got := RequestLabel("namespace-requests", "ci"); got != "namespace-requests.ci" {
		t.Errorf("short label = %q", got)
	}
	long1 := RequestLabel(strings.Repeat("r", 63), strings.Repeat("a", 63))
	long2 := RequestLabel(strings.Repeat("r", 63), strings.Repeat("a", 62)+"b")
	for _, v := range []string{long1, long2} {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%q is not a label value: %v", v, errs)
		}
	}
	if long1 == long2 {
		t.Error("two long requests share a label value")
	}
}

func TestTokenRefreshBeforeEightyPercent(t *testing.T) {
	issued := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := TokenState{IssuedAt: issued, ExpiresAt: issued.Add(10 * time.Hour)}
	for _, j := range []float64{0, 0.5, 0.999} {
		at := s.RefreshAt(j)
		if at.Before(issued.Add(7*time.Hour)) || !at.Before(issued.Add(8*time.Hour)) {
			t.Errorf("jitter %v: refresh at %s, want within [70%%, 80%%) of the lifetime", j, at.Sub(issued))
		}
	}
	if s.NeedsRefresh(issued.Add(time.Hour), 10*time.Hour, 0.5) {
		t.Error("a fresh token needs refresh")
	}
	if !s.NeedsRefresh(issued.Add(8*time.Hour), 10*time.Hour, 0.5) {
		t.Error("a token at 80% of its life does not need refresh")
	}
	if !s.NeedsRefresh(issued.Add(time.Hour), time.Hour, 0.5) {
		t.Error("a shorter token-ttl does not force a new token")
	}
	if s.NeedsRefresh(issued.Add(time.Hour), 100*time.Hour, 0.5) {
		t.Error("a longer token-ttl forces a new token at once (it may loop when the server caps lifetimes)")
	}
	if !(TokenState{}).NeedsRefresh(issued, time.Hour, 0) {
		t.Error("an unknown token does not need refresh")
	}
	if j := Jitter("a"); j < 0 || j >= 1 || j != Jitter("a") {
		t.Errorf("Jitter not stable in [0,1): %v", j)
	}
}

// FuzzParse: no request, however odd, crashes Parse or is accepted with an invalid namespace name.
func FuzzParse(f *testing.F) {
	f.Add("ci-branch-foo", "72h", "1h")
	f.Add("kube-x", "", "")
	f.Add("a.b", "-1s", "9999999h")
	f.Fuzz(func(t *testing.T, name, ttl, tokenTTL string) {
		p := &Policy{RequestsNamespace: "r", OperatorNamespace: "o", TokenTTL: time.Hour, MaxTokenTTL: 2 * time.Hour}
		req, rej := p.Parse(name, map[string]string{"ttl": ttl, "token-ttl": tokenTTL})
		if (req == nil) == (rej == nil) {
			t.Fatalf("want exactly one of request and rejection, got %v %v", req, rej)
		}
		if req != nil {
			if len(validation.IsDNS1123Label(req.Namespace)) > 0 || req.TTL <= 0 || req.TokenTTL < MinTokenTTL || req.TokenTTL > 2*time.Hour {
				t.Fatalf("accepted %+v", req)
			}
		}
	})
}

func TestTokenTimesReadsTheServersClock(t *testing.T) {
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"iat":1700000000,"exp":1700003600,"sub":"system:serviceaccount:n:admin"}`))
	issued, expires, ok := TokenTimes("header." + payload + ".signature")
	if !ok || issued.Unix() != 1700000000 || expires.Sub(issued) != time.Hour {
		t.Errorf("TokenTimes = %v %v %v", issued, expires, ok)
	}
	for _, bad := range []string{"", "opaque-token", "a.b.c", "a." + base64.RawURLEncoding.EncodeToString([]byte(`{"iat":5,"exp":1}`)) + ".c"} {
		if _, _, ok := TokenTimes(bad); ok {
			t.Errorf("TokenTimes(%q) ok", bad)
		}
	}
}

// TestLoadDefaultsProfiles: the top level is the profile every request gets; named profiles hold
// only what they name; a bad profile name, an unknown key or a bad copy list inside a profile stops
// the file, naming where.
func TestLoadDefaultsProfiles(t *testing.T) {
	write := func(body string) string {
		p := filepath.Join(t.TempDir(), "defaults.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	d, err := LoadDefaults(write(`
isolateNetwork: true
resourceQuota: {hard: {pods: "50"}}
profiles:
  pull-requests:
    resourceQuota: {hard: {pods: "5"}}
    copy: {secrets: [registry-pull]}
`))
	if err != nil {
		t.Fatal(err)
	}
	top, err := d.ProfileNamed("")
	if err != nil || !top.IsolateNetwork || top.ResourceQuota.Hard.Pods().String() != "50" {
		t.Errorf("top level = %+v, %v", top, err)
	}
	pr, err := d.ProfileNamed("pull-requests")
	if err != nil || pr.IsolateNetwork || pr.ResourceQuota.Hard.Pods().String() != "5" || len(pr.Copy.Secrets) != 1 {
		t.Errorf("profile = %+v, %v", pr, err)
	}
	if !d.Copying() {
		t.Error("a profile copies, Copying says none does")
	}
	if _, err := d.ProfileNamed("large"); err == nil || !strings.Contains(err.Error(), `"large" is not defined in --namespace-defaults (profiles: pull-requests)`) {
		t.Errorf("unknown profile: %v", err)
	}
	for body, want := range map[string]string{
		"profiles:\n  Big_One: {}\n":                                    `"Big_One" is no profile name`,
		"profiles:\n  big:\n    quota: {}\n":                            `unknown field "quota"`,
		"profiles:\n  big:\n    copy: {secrets: [a, a]}\n":              `profiles.big: copy.secrets names "a" twice`,
		"profiles:\n  big:\n    copy: {configMaps: [\"not a name\"]}\n": `profiles.big: copy.configMaps: "not a name" is no object name`,
	} {
		if _, err := LoadDefaults(write(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
	if d, _ := LoadDefaults(""); d.Copying() {
		t.Error("no defaults copy something")
	}
}
