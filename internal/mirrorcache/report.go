package mirrorcache

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// The cache's note of its pins (mirror.CacheReport): what it holds of them, what it fetches and
// what failed. The loop builds it at every look at the volume; a reporter hands it to
// Options.Report when it changed, at most once per reportEvery and the latest only, and again
// after reportRetry when a report failed (the API server unreachable: the note stays as it was,
// which the controller reads as a pod that did not report since).
const (
	reportEvery   = 5 * time.Second
	reportRetry   = 10 * time.Second
	reportTimeout = 10 * time.Second
)

type reporter struct {
	send func(context.Context, mirror.CacheReport) error
	log  logr.Logger
	wake chan struct{}

	mu   sync.Mutex
	want *mirror.CacheReport // the latest report not sent yet
	sent string              // the last report sent, as its annotation
}

func newReporter(send func(context.Context, mirror.CacheReport) error, log logr.Logger) *reporter {
	return &reporter{send: send, log: log, wake: make(chan struct{}, 1)}
}

// set makes r the report to send, unless it was the last one sent.
func (p *reporter) set(r mirror.CacheReport) {
	p.mu.Lock()
	if r.Annotation() == p.sent {
		p.want = nil
		p.mu.Unlock()
		return
	}
	p.want = &r
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run sends the reports until ctx ends.
func (p *reporter) run(ctx context.Context) {
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		r := p.want
		p.want = nil
		p.mu.Unlock()
		if r == nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, reportTimeout)
		err := p.send(sctx, *r)
		cancel()
		pause := reportEvery
		p.mu.Lock()
		if err != nil {
			if p.want == nil { // nothing newer: this one is sent again
				p.want = r
			}
			pause = reportRetry
		} else {
			p.sent = r.Annotation()
		}
		p.mu.Unlock()
		switch {
		case err != nil && !failing:
			failing = true
			p.log.Error(err, "noting the pins' state on the cache's Pod: trying again", "retryIn", reportRetry.String())
		case err == nil && failing:
			failing = false
			p.log.Info("noting the pins' state on the cache's Pod again")
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		select { // what came meanwhile, or the failed report, goes now
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// report builds the cache's note from the loop's look and hands it to the reporter.
func (f *front) report(w warmState) {
	if f.reporter == nil {
		return
	}
	count := 0
	if p := f.pins.Load(); p != nil {
		count = p.count
	}
	f.reporter.set(mirror.NewCacheReport(f.pinsHash, count, int64(f.pinnedBytes), f.pinnedOver, w.warming, w.failed)) //nolint:gosec // a volume's size fits
}
