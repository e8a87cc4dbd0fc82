// Package cli reads the command line of every command of the quartermaster binary (the manager,
// request, registry-mirror, node-agent) one way: kubectl's. Flags may come before, between or
// after the arguments, as --flag=value or --flag value. Commands register their flags on a Go
// flag.FlagSet, as the controllers' AddFlags, controller-runtime's config.RegisterFlags and zap's
// BindFlags do; Parse reads them with pflag, and still accepts the single-dash long form the flag
// package accepted before (-leader-elect, -zap-log-level=debug), so no existing invocation breaks.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/spf13/pflag"
)

// Usage is what a command's --help says besides its flags.
type Usage struct {
	// Command is the command as typed, e.g. "quartermaster request".
	Command string
	// Args follows the command in the usage line, e.g. "NAME"; empty for none.
	Args string
	// About says what the command does.
	About string
	// Examples are command lines, each after a "# what it does" line.
	Examples []string
}

// Parse reads args into the flags registered on fs and returns the arguments that are not flags,
// in order; everything after "--" is an argument. -h, --help (and Go's -help, --h) write the usage
// to fs.Output() and return flag.ErrHelp. A flag error names the command's --help.
func Parse(fs *flag.FlagSet, u Usage, args []string) ([]string, error) {
	pfs := pflag.NewFlagSet(fs.Name(), pflag.ContinueOnError)
	pfs.SetOutput(fs.Output())
	fs.VisitAll(func(f *flag.Flag) { pfs.AddFlag(fromGo(fs, f)) })
	pfs.Usage = func() { u.write(fs.Output(), pfs) }
	if err := pfs.Parse(longForm(pfs, args)); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, flag.ErrHelp
		}
		return nil, u.Errorf("%w", err)
	}
	return pfs.Args(), nil
}

// Errorf returns an error that ends by pointing at the command's --help (kubectl's "See ... --help").
func (u Usage) Errorf(format string, a ...any) error {
	return fmt.Errorf(format+"; see '%s --help'", append(a, u.Command)...)
}

// fromGo makes a pflag flag of a Go flag. Setting it goes through fs, so fs.Visit still sees the
// flags that were set; its type is the one the flag package's own usage would print.
func fromGo(fs *flag.FlagSet, f *flag.Flag) *pflag.Flag {
	// The flag package's guess of the value's type ("string", "duration", "value"); pflag reads a
	// back-quoted name in the usage itself.
	typ, _ := flag.UnquoteUsage(&flag.Flag{Value: f.Value})
	if typ == "" {
		typ = "bool"
	}
	// pflag tells a zero default by its own value types only; the default is written here the flag
	// package's way instead (not for zero values, quoted for strings).
	usage := f.Usage
	if !isZero(f) {
		format := " (default %v)"
		if typ == "string" {
			format = " (default %q)"
		}
		usage += fmt.Sprintf(format, f.DefValue)
	}
	pf := &pflag.Flag{
		Name:  f.Name,
		Usage: usage,
		Value: goValue{fs: fs, name: f.Name, typ: typ, Value: f.Value},
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		pf.NoOptDefVal = "true"
	}
	return pf
}

// isZero reports whether f's default is its type's zero value, as the flag package's usage
// decides it (a value type whose zero value cannot print counts as zero).
func isZero(f *flag.Flag) (zero bool) {
	defer func() {
		if recover() != nil {
			zero = true
		}
	}()
	t := reflect.TypeOf(f.Value)
	var z reflect.Value
	if t.Kind() == reflect.Pointer {
		z = reflect.New(t.Elem())
	} else {
		z = reflect.Zero(t)
	}
	return f.DefValue == z.Interface().(flag.Value).String()
}

type goValue struct {
	flag.Value
	fs   *flag.FlagSet
	name string
	typ  string
}

func (v goValue) Set(s string) error { return v.fs.Set(v.name, s) }
func (v goValue) Type() string       { return v.typ }

// longForm rewrites the flag package's single-dash long flags (-leader-elect, -ttl=1h, -ttl 1h),
// which pflag would read as a cluster of one-letter flags, to --name. Values and arguments are
// left as they are: the argument after a flag that takes a value is its value, even when it
// starts with a dash, as with both packages.
func longForm(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) < 2 || a[0] != '-' {
			out = append(out, a)
			continue
		}
		spec := strings.TrimPrefix(a[1:], "-")
		name, _, hasValue := strings.Cut(spec, "=")
		f := fs.Lookup(name)
		switch {
		case f == nil && (name == "h" || name == "help"):
			out = append(out, "--help")
		case f == nil:
			out = append(out, a) // pflag reports it, or reads it as shorthands
		default:
			out = append(out, "--"+spec)
			if !hasValue && f.NoOptDefVal == "" && i+1 < len(args) {
				i++
				out = append(out, args[i])
			}
		}
	}
	return out
}

func (u Usage) write(w io.Writer, fs *pflag.FlagSet) {
	line := u.Command + " [flags]"
	if u.Args != "" {
		line += " " + u.Args
	}
	fmt.Fprintf(w, "Usage:\n  %s\n", line)
	if u.About != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(u.About))
	}
	if len(u.Examples) > 0 {
		fmt.Fprintf(w, "\nExamples:\n")
		for i, e := range u.Examples {
			if i > 0 {
				fmt.Fprintln(w)
			}
			for _, l := range strings.Split(strings.TrimSpace(e), "\n") {
				fmt.Fprintf(w, "  %s\n", l)
			}
		}
	}
	fmt.Fprintf(w, "\nFlags:\n%s", fs.FlagUsages())
}
