// Command testreport runs the stages of `make test` and says where their time goes.
//
//	testreport stage NAME -- COMMAND [ARGS...]
//	testreport summary
//
// stage runs COMMAND, records its wall time, CPU time (the command's and its children's) and exit
// status in DIR/NAME.stage.json, and passes its exit status on. When COMMAND is `go test -json`,
// its events are kept in DIR/NAME.jsonl and printed as `go test` prints them without -v: a line per
// package, and the whole output of each test that failed (or of a package that did not build or
// panicked). Any other output is passed through as it comes.
//
// summary prints the table of every recorded stage and the slowest tests, and writes it to
// DIR/summary.txt. DIR is $QM_TEST_REPORT_DIR, or bin/test-report.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	dir := os.Getenv("QM_TEST_REPORT_DIR")
	if dir == "" {
		dir = filepath.Join("bin", "test-report")
	}
	switch os.Args[1] {
	case "stage":
		args := os.Args[2:]
		if len(args) < 3 || args[1] != "--" {
			usage()
		}
		os.Exit(runStage(dir, args[0], args[2:]))
	case "summary":
		if err := summary(dir, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(1)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testreport stage NAME -- COMMAND [ARGS...] | testreport summary")
	os.Exit(2)
}

// Stage is what stage records of one run.
type Stage struct {
	Name    string        `json:"name"`
	Command string        `json:"command"`
	Start   time.Time     `json:"start"`
	Wall    time.Duration `json:"wall"`
	CPU     time.Duration `json:"cpu"`
	Exit    int           `json:"exit"`
}

func runStage(dir, name string, command []string) int {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		return 1
	}
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		return 1
	}
	events, err := os.Create(filepath.Join(dir, name+".jsonl"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		return 1
	}
	defer events.Close()
	// An interrupt reaches the command too (it is in our process group); we wait for it to end.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "testreport: stage %s: %v\n", name, err)
		return 1
	}
	printer := newPrinter(os.Stdout, name)
	copyErr := printer.read(stdout, events)
	err = cmd.Wait()
	st := Stage{Name: name, Command: strings.Join(command, " "), Start: start, Wall: time.Since(start)}
	if cmd.ProcessState != nil {
		st.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		st.Exit = exit.ExitCode()
		if st.Exit < 0 { // killed by a signal
			st.Exit = 1
		}
	case err != nil:
		fmt.Fprintf(os.Stderr, "testreport: stage %s: %v\n", name, err)
		st.Exit = 1
	case copyErr != nil:
		fmt.Fprintf(os.Stderr, "testreport: stage %s: reading its output: %v\n", name, copyErr)
		st.Exit = 1
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, name+".stage.json"), append(b, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
	}
	result := "passed"
	if st.Exit != 0 {
		result = fmt.Sprintf("FAILED (exit %d)", st.Exit)
	}
	fmt.Printf("testreport: stage %s %s in %s (CPU %s)\n", name, result, round(st.Wall), round(st.CPU))
	return st.Exit
}

// Event is one line of `go test -json` (cmd/test2json).
type Event struct {
	Time       time.Time `json:",omitempty"`
	Action     string
	Package    string  `json:",omitempty"`
	ImportPath string  `json:",omitempty"`
	Test       string  `json:",omitempty"`
	Elapsed    float64 `json:",omitempty"`
	Output     string  `json:",omitempty"`
}

// printer turns go test's events back into its non-verbose output: what a reader of CI's log
// wants, the failures whole, and a line per package.
type printer struct {
	w     io.Writer
	stage string
	// output buffered per package and test, until the test passes (dropped) or fails (printed).
	tests map[string]map[string]*strings.Builder
	build map[string]*strings.Builder
}

func newPrinter(w io.Writer, stage string) *printer {
	return &printer{w: w, stage: stage, tests: map[string]map[string]*strings.Builder{}, build: map[string]*strings.Builder{}}
}

func (p *printer) read(r io.Reader, events io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e Event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			// Not go test's: pass it through.
			fmt.Fprintf(p.w, "%s\n", line)
			continue
		}
		if _, err := events.Write(append(line, '\n')); err != nil {
			return err
		}
		p.event(e)
	}
	return sc.Err()
}

func (p *printer) buffer(pkg, test string) *strings.Builder {
	byTest := p.tests[pkg]
	if byTest == nil {
		byTest = map[string]*strings.Builder{}
		p.tests[pkg] = byTest
	}
	b := byTest[test]
	if b == nil {
		b = &strings.Builder{}
		byTest[test] = b
	}
	return b
}

func (p *printer) event(e Event) {
	switch e.Action {
	case "build-output":
		b := p.build[e.ImportPath]
		if b == nil {
			b = &strings.Builder{}
			p.build[e.ImportPath] = b
		}
		b.WriteString(e.Output)
	case "build-fail":
		if b := p.build[e.ImportPath]; b != nil {
			fmt.Fprint(p.w, b.String())
		}
	case "output":
		if e.Test == "" {
			// The package's own lines: its result line, and what it printed outside any test (a
			// TestMain's output, a panic, a timeout).
			out := e.Output
			if strings.HasPrefix(out, "ok ") || strings.HasPrefix(out, "FAIL") || strings.HasPrefix(out, "?") ||
				strings.HasPrefix(out, "PASS") || strings.HasPrefix(out, "=== ") || strings.HasPrefix(out, "--- ") {
				return // the result line is printed on pass/fail, with the stage's name
			}
			p.buffer(e.Package, "").WriteString(out)
			return
		}
		p.buffer(e.Package, e.Test).WriteString(e.Output)
	case "pass", "skip":
		if e.Test != "" {
			delete(p.tests[e.Package], e.Test)
			return
		}
		if e.Action == "pass" {
			fmt.Fprintf(p.w, "ok  \t%s\t%.1fs\n", e.Package, e.Elapsed)
		}
		delete(p.tests, e.Package)
	case "fail":
		if e.Test != "" {
			b := p.buffer(e.Package, e.Test)
			// A parent's failure prints its subtests' failures within its own output (go test
			// does the same): print it when the top-level test ends.
			if parent, _, sub := strings.Cut(e.Test, "/"); sub {
				p.buffer(e.Package, parent).WriteString(b.String())
				delete(p.tests[e.Package], e.Test)
				return
			}
			fmt.Fprint(p.w, b.String())
			delete(p.tests[e.Package], e.Test)
			return
		}
		// The package failed: whatever is left (a test still running at a panic or timeout, the
		// package's own output) is the reason.
		names := make([]string, 0, len(p.tests[e.Package]))
		for name := range p.tests[e.Package] {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			fmt.Fprint(p.w, p.tests[e.Package][name].String())
		}
		fmt.Fprintf(p.w, "FAIL\t%s\t%.1fs\n", e.Package, e.Elapsed)
		delete(p.tests, e.Package)
	}
}

// summary prints the stages' table and the slowest tests of every stage's events.
func summary(dir string, stdout io.Writer) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.stage.json"))
	if err != nil {
		return err
	}
	var stages []Stage
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var st Stage
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		stages = append(stages, st)
	}
	if len(stages) == 0 {
		return fmt.Errorf("no stage recorded under %s", dir)
	}
	sort.Slice(stages, func(i, j int) bool { return stages[i].Start.Before(stages[j].Start) })
	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "stage\tstarts at\twall\tCPU\tresult\t")
	first, last := stages[0].Start, stages[0].Start
	var cpu time.Duration
	for _, st := range stages {
		end := st.Start.Add(st.Wall)
		if end.After(last) {
			last = end
		}
		cpu += st.CPU
		result := "ok"
		if st.Exit != 0 {
			result = fmt.Sprintf("FAIL (%d)", st.Exit)
		}
		fmt.Fprintf(tw, "%s\t+%s\t%s\t%s\t%s\t\n", st.Name, clock(st.Start.Sub(first)), clock(st.Wall), clock(st.CPU), result)
	}
	fmt.Fprintf(tw, "all\t\t%s\t%s\t\t\n", clock(last.Sub(first)), clock(cpu))
	if err := tw.Flush(); err != nil {
		return err
	}

	type timed struct {
		stage, pkg, test string
		elapsed          float64
	}
	var tests, pkgs []timed
	for _, st := range stages {
		f, err := os.Open(filepath.Join(dir, st.Name+".jsonl"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
		for sc.Scan() {
			var e Event
			if json.Unmarshal(sc.Bytes(), &e) != nil || (e.Action != "pass" && e.Action != "fail") {
				continue
			}
			switch {
			case e.Test == "":
				pkgs = append(pkgs, timed{st.Name, e.Package, "", e.Elapsed})
			case !strings.Contains(e.Test, "/"):
				tests = append(tests, timed{st.Name, e.Package, e.Test, e.Elapsed})
			}
		}
		f.Close()
	}
	slowest := func(title string, list []timed, n int) error {
		if len(list) == 0 {
			return nil
		}
		sort.SliceStable(list, func(i, j int) bool { return list[i].elapsed > list[j].elapsed })
		if len(list) > n {
			list = list[:n]
		}
		fmt.Fprintf(&out, "\n%s\n", title)
		tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
		for _, t := range list {
			name := strings.TrimPrefix(t.pkg, "github.com/quartermaster-dev/quartermaster/")
			if t.test != "" {
				name += "." + t.test
			}
			fmt.Fprintf(tw, "%8.1fs\t%s\t%s\n", t.elapsed, t.stage, name)
		}
		return tw.Flush()
	}
	if err := slowest("the slowest 15 tests (top-level; parallel tests overlap):", tests, 15); err != nil {
		return err
	}
	if err := slowest("the slowest 10 packages:", pkgs, 10); err != nil {
		return err
	}
	fmt.Fprint(stdout, out.String())
	return os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(out.String()), 0o644)
}

func round(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }

// clock is d as m:ss.
func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}
