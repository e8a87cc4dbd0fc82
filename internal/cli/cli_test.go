package cli

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

type parsed struct {
	ns      string
	ttl     time.Duration
	debug   bool
	zapOpts zap.Options
	set     []string // the flags fs.Visit reports as set
}

var testUsage = Usage{
	Command:  "quartermaster test",
	Args:     "NAME",
	About:    "Tests the command line.",
	Examples: []string{"# flags after the name\nquartermaster test ci-good --ns=x", "# flags first\nquartermaster test --ns x ci-good"},
}

func parse(args ...string) (parsed, []string, string, error) {
	var p parsed
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var out strings.Builder
	fs.SetOutput(&out)
	fs.StringVar(&p.ns, "ns", "default-ns", "the `namespace` to use")
	fs.DurationVar(&p.ttl, "ttl", 0, "how long")
	fs.BoolVar(&p.debug, "debug", false, "more output")
	fs.String("addr", "0", "an address; 0 disables")
	fs.Duration("timeout", 2*time.Minute, "how long to wait")
	fs.Bool("secure", true, "serve HTTPS")
	p.zapOpts.BindFlags(fs)
	rest, err := Parse(fs, testUsage, args)
	fs.Visit(func(f *flag.Flag) { p.set = append(p.set, f.Name) })
	return p, rest, out.String(), err
}

func TestFlagsInAnyOrderAndEitherForm(t *testing.T) {
	for _, args := range [][]string{
		{"ci-good", "--ns=team", "--ttl=1h", "--debug"},
		{"ci-good", "--ns", "team", "--ttl", "1h", "--debug"},
		{"--ns=team", "--ttl=1h", "--debug", "ci-good"},
		{"--ns", "team", "--ttl", "1h", "--debug", "ci-good"},
		{"--ns", "team", "ci-good", "--ttl=1h", "--debug=true"},
		// Go's flag package's single-dash long form, which the binary accepted before.
		{"-ns=team", "-ttl", "1h", "-debug", "ci-good"},
		{"ci-good", "-ns", "team", "-ttl=1h", "-debug=true"},
	} {
		p, rest, out, err := parse(args...)
		if err != nil || p.ns != "team" || p.ttl != time.Hour || !p.debug || !slices.Equal(rest, []string{"ci-good"}) {
			t.Errorf("%q: ns %q ttl %s debug %v args %q err %v", args, p.ns, p.ttl, p.debug, rest, err)
		}
		if !slices.Equal(p.set, []string{"debug", "ns", "ttl"}) {
			t.Errorf("%q: fs.Visit sees %v set, want debug, ns, ttl", args, p.set)
		}
		if out != "" {
			t.Errorf("%q wrote %q", args, out)
		}
	}
}

func TestDefaultsAndArguments(t *testing.T) {
	p, rest, _, err := parse("a", "b")
	if err != nil || p.ns != "default-ns" || p.ttl != 0 || p.debug || !slices.Equal(rest, []string{"a", "b"}) || len(p.set) != 0 {
		t.Errorf("%+v %q %v", p, rest, err)
	}
	// After --, everything is an argument; a value that starts with a dash is still the flag's value.
	p, rest, _, err = parse("--ns", "-odd", "--", "--debug", "-ttl=1h")
	if err != nil || p.ns != "-odd" || p.debug || !slices.Equal(rest, []string{"--debug", "-ttl=1h"}) {
		t.Errorf("%+v %q %v", p, rest, err)
	}
	// A boolean flag does not take the next argument as its value.
	p, rest, _, err = parse("--debug", "false")
	if err != nil || !p.debug || !slices.Equal(rest, []string{"false"}) {
		t.Errorf("--debug false: %+v %q %v", p, rest, err)
	}
	// zap's flags (Go flag.Values of their own) are read like the others.
	p, _, _, err = parse("x", "-zap-log-level=debug", "--zap-devel")
	if err != nil || !p.zapOpts.Development || p.zapOpts.Level == nil {
		t.Errorf("zap flags: %+v %v", p.zapOpts, err)
	}
}

func TestErrorsPointAtHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"x", "--nope"}, "unknown flag: --nope"},
		{[]string{"x", "-nope"}, "unknown shorthand flag: 'n' in -nope"},
		{[]string{"x", "--ttl=soon"}, `invalid argument "soon" for "--ttl" flag`},
		{[]string{"x", "--ns"}, "flag needs an argument: --ns"},
	} {
		_, _, out, err := parse(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasSuffix(err.Error(), "; see 'quartermaster test --help'") {
			t.Errorf("%q: %v, want %q and a pointer to --help", tc.args, err, tc.want)
		}
		if out != "" {
			t.Errorf("%q wrote %q besides the error", tc.args, out)
		}
	}
}

func TestHelpShowsUsageExamplesAndFlags(t *testing.T) {
	for _, help := range []string{"--help", "-h", "-help", "--h"} {
		_, _, out, err := parse("ci-good", help)
		if !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: %v, want flag.ErrHelp", help, err)
		}
		for _, want := range []string{
			"Usage:\n  quartermaster test [flags] NAME\n",
			"Tests the command line.",
			"Examples:\n  # flags after the name\n  quartermaster test ci-good --ns=x\n\n  # flags first\n",
			"--ns namespace", `the namespace to use (default "default-ns")`,
			"--ttl duration                 how long\n", "--debug                        more output\n",
			`--addr string                  an address; 0 disables (default "0")`,
			"--timeout duration             how long to wait (default 2m0s)", "--secure                       serve HTTPS (default true)",
			"--zap-log-level value",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: the usage lacks %q:\n%s", help, want, out)
			}
		}
	}
}

func ExampleParse() {
	fs := flag.NewFlagSet("request", flag.ContinueOnError)
	ttl := fs.Duration("ttl", 0, "how long the namespace lives")
	args, err := Parse(fs, Usage{Command: "quartermaster request", Args: "NAME"}, []string{"ci-good", "--ttl", "2h"})
	fmt.Println(args, *ttl, err)
	// Output: [ci-good] 2h0m0s <nil>
}
