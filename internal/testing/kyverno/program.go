package kyverno

import (
	"errors"
	"fmt"
	"os"
	"sync"
)

// Program is the TB of a program outside go test that runs Kyverno with these helpers (the demo's
// helper, the bench): it logs to stderr, keeps the cleanups (Close runs them, last first, once),
// and a Fatal inside Run ends Run with the fatal message as its error.
type Program struct {
	// Dir is what TempDir returns; empty: a new temporary folder each time.
	Dir string

	mu       sync.Mutex
	failed   bool
	cleanups []func()
}

// programFatal carries a Fatal's message to Run.
type programFatal struct{ msg string }

// Run calls f, returning the message of a Fatal f made as an error.
func (p *Program) Run(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fatal, ok := r.(programFatal)
			if !ok {
				panic(r)
			}
			err = errors.New(fatal.msg)
		}
	}()
	f()
	return nil
}

// Close runs the registered cleanups, last first, once.
func (p *Program) Close() {
	p.mu.Lock()
	fs := p.cleanups
	p.cleanups = nil
	p.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// Helper does nothing: a program has no test frames to skip.
func (p *Program) Helper() {}

// Fatal marks the program failed and ends Run with the message.
func (p *Program) Fatal(args ...any) {
	p.setFailed()
	panic(programFatal{fmt.Sprint(args...)})
}

// Fatalf is Fatal with a format.
func (p *Program) Fatalf(format string, args ...any) { p.Fatal(fmt.Sprintf(format, args...)) }

// Errorf marks the program failed and logs the message.
func (p *Program) Errorf(format string, args ...any) {
	p.setFailed()
	fmt.Fprintf(os.Stderr, "kyverno: "+format+"\n", args...)
}

// Logf logs the message.
func (p *Program) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

// TempDir is Dir, or a new temporary folder when Dir is empty.
func (p *Program) TempDir() string {
	if p.Dir != "" {
		return p.Dir
	}
	dir, err := os.MkdirTemp("", "kyverno")
	if err != nil {
		p.Fatal(err)
	}
	return dir
}

// Failed reports whether Fatal or Errorf was called.
func (p *Program) Failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// Cleanup registers f for Close.
func (p *Program) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

func (p *Program) setFailed() {
	p.mu.Lock()
	p.failed = true
	p.mu.Unlock()
}
