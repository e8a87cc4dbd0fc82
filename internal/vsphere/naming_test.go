package vsphere

import (
	"strings"
	"testing"
)

func TestFolderName(t *testing.T) {
	if got := FolderName("team-a", "web"); got != "team-a-web" {
		t.Errorf("FolderName = %q", got)
	}
	long := FolderName(strings.Repeat("n", 63), strings.Repeat("v", 50))
	if len(long) != MaxNameLength {
		t.Errorf("long folder name has %d characters, want %d: %q", len(long), MaxNameLength, long)
	}
	other := FolderName(strings.Repeat("n", 63), strings.Repeat("v", 49)+"w")
	if long == other {
		t.Errorf("cut names collide: %q", long)
	}
	if FolderName(strings.Repeat("n", 63), strings.Repeat("v", 50)) != long {
		t.Error("FolderName is not deterministic")
	}
	// "a-b"/"c" and "a"/"b-c" both read a-b-c; the operator tells them apart by the VMs' group mark.
	if FolderName("a-b", "c") != FolderName("a", "b-c") {
		t.Error("expected the documented ambiguity of short names")
	}
}

func TestOrdinal(t *testing.T) {
	cases := []struct {
		group, name string
		want        int
		ok          bool
	}{
		{"web", "web-0", 0, true},
		{"web", "web-12", 12, true},
		{"web", "web-012", 0, false},
		{"web", "web-", 0, false},
		{"web", "web-+1", 0, false},
		{"web", "web--1", 0, false},
		{"web", "web-1a", 0, false},
		{"web", "web-1234567890", 0, false},
		{"web", "webx-1", 0, false},
		{"web", "web", 0, false},
		{"web-1", "web-1-0", 0, true},
		{"web", "web-1-0", 0, false},
		{"web", "web-٣", 0, false}, // Arabic-Indic digit
	}
	for _, c := range cases {
		got, ok := Ordinal(c.group, c.name)
		if got != c.want || ok != c.ok {
			t.Errorf("Ordinal(%q, %q) = %d, %v; want %d, %v", c.group, c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestServerURL(t *testing.T) {
	cases := []struct{ in, want, err string }{
		{in: "vc.example.com", want: "https://vc.example.com/sdk"},
		{in: " vc.example.com:8443 ", want: "https://vc.example.com:8443/sdk"},
		{in: "https://vc.example.com", want: "https://vc.example.com/sdk"},
		{in: "https://vc.example.com/", want: "https://vc.example.com/sdk"},
		{in: "https://127.0.0.1:4443/sdk", want: "https://127.0.0.1:4443/sdk"},
		{in: "http://vc.local/custom", want: "http://vc.local/custom"},
		{in: "[::1]:443", want: "https://[::1]:443/sdk"},
		{in: "", err: "empty"},
		{in: "ftp://vc", err: "https"},
		{in: "https://admin:s3cret@vc", err: "credentials"},
		{in: "https://:443", err: "no host"},
		{in: "vc:99999", err: "port"},
		{in: "vc:port", err: "not a host"},
		{in: "https://vc/sdk?x=1", err: "query"},
	}
	for _, c := range cases {
		u, err := ServerURL(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ServerURL(%q) error = %v, want one containing %q", c.in, err, c.err)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("ServerURL(%q) error repeats the password: %v", c.in, err)
			}
			continue
		}
		if err != nil || u.String() != c.want {
			t.Errorf("ServerURL(%q) = %v, %v; want %s", c.in, u, err, c.want)
		}
	}
}

func FuzzOrdinal(f *testing.F) {
	f.Add("web", 0)
	f.Add("web-1", 17)
	f.Add("", 3)
	f.Fuzz(func(t *testing.T, group string, n int) {
		if n < 0 || n > 999_999_999 {
			return
		}
		got, ok := Ordinal(group, VMName(group, n))
		if !ok || got != n {
			t.Fatalf("Ordinal(VMName(%q, %d)) = %d, %v", group, n, got, ok)
		}
	})
}

func FuzzServerURL(f *testing.F) {
	for _, s := range []string{"vc", "vc:443", "https://vc/sdk", "https://u:p@vc", "[::1]:1", "http://x/y?z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		u, err := ServerURL(in)
		if err != nil {
			if in != "" && len(in) > 3 && strings.Contains(err.Error(), in) {
				t.Fatalf("error repeats the input: %v", err)
			}
			return
		}
		if u.User != nil || u.Hostname() == "" || (u.Scheme != "https" && u.Scheme != "http") || u.Path == "" {
			t.Fatalf("ServerURL(%q) = %v", in, u)
		}
	})
}
