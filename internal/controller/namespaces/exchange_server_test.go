package namespaces

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestExchangeReadiness: the controller's part of the manager's /readyz (registered before the
// manager starts: a check cannot be added once its probe server runs) fails until the exchange
// listens and again once it has stopped, so that a Service never sends a CI job to a replica that
// refuses the connection (an e2e step once raced the listener this way).
func TestExchangeReadiness(t *testing.T) {
	t.Parallel()
	certDir := t.TempDir()
	testenv.ServingCert(t, certDir)
	listening := make(chan net.Addr, 1)
	o := &Options{ExchangeAddress: "127.0.0.1:0"}
	s := &exchangeServer{addr: o.ExchangeAddress, certDir: certDir, listening: func(a net.Addr) { listening <- a }, ready: &o.exchangeUp}
	if err := o.readyz(nil); err == nil {
		t.Fatal("ready before the exchange was started")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	var addr net.Addr
	select {
	case addr = <-listening:
	case err := <-done:
		t.Fatalf("the exchange stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the exchange did not listen")
	}
	// Start marks readiness right after it starts serving on the listener it announced.
	eventually(t, "the exchange to be ready", func() bool { return o.readyz(nil) == nil }, func() string { return "" })
	conn, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatalf("ready but not accepting connections: %v", err)
	}
	conn.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the exchange's shutdown: %v", err)
	}
	if err := o.readyz(nil); err == nil {
		t.Error("still ready after the exchange stopped")
	}
	if err := (&Options{}).readyz(nil); err != nil {
		t.Errorf("without the exchange: %v, want ready", err)
	}
}
