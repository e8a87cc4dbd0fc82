package namespaces

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	nsv1alpha1 "github.com/quartermaster-dev/quartermaster/api/namespaces/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/pipelineid"
)

// exchangeServer serves the exchange over TLS on every replica (it needs no leadership: it writes
// request ConfigMaps, which the leader's controller serves). The certificate is read from certDir
// (tls.crt, tls.key) and read again when it changes (cert-manager's renewals).
type exchangeServer struct {
	addr, certDir string
	handler       http.Handler
	// listening, when set, is told the address the server listens on (tests bind port 0).
	listening func(net.Addr)
	// ready is set while the server listens (Options.readyz reads it for the manager's /readyz,
	// so that a Service sends no exchange to a replica that would refuse the connection).
	ready *atomic.Bool
}

func (s *exchangeServer) NeedLeaderElection() bool { return false }

func (s *exchangeServer) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("exchange")
	cw, err := certwatcher.New(filepath.Join(s.certDir, "tls.crt"), filepath.Join(s.certDir, "tls.key"))
	if err != nil {
		return fmt.Errorf("the exchange's certificate (--exchange-cert-dir %s): %w", s.certDir, err)
	}
	go func() {
		if err := cw.Start(ctx); err != nil {
			log.Error(err, "watching the exchange's certificate")
		}
	}()
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("--exchange-bind-address %s: %w", s.addr, err)
	}
	if s.listening != nil {
		s.listening(ln.Addr())
	}
	srv := &http.Server{
		Handler:           s.handler,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cw.GetCertificate},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    pipelineid.MaxTokenSize + 16<<10, // the token travels in a header
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	s.ready.Store(true)
	defer s.ready.Store(false)
	log.Info("serving token exchanges", "address", ln.Addr().String(), "path", nsrequest.ExchangePath)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// usedTokenSweeper deletes the records of used tokens once the tokens have expired (a replay is
// refused by the token's own exp from then on). It runs on the leader, once a minute.
type usedTokenSweeper struct {
	client    client.Client
	namespace string
	every     time.Duration
	now       func() time.Time
}

func (s *usedTokenSweeper) NeedLeaderElection() bool { return true }

func (s *usedTokenSweeper) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("exchange")
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := s.sweep(ctx); err != nil {
			log.Error(err, "deleting the records of expired tokens")
		}
	}
}

// sweep deletes the records of tokens past their expiry (and the skew).
func (s *usedTokenSweeper) sweep(ctx context.Context) error {
	var leases coordinationv1.LeaseList
	if err := s.client.List(ctx, &leases, client.InNamespace(s.namespace), client.MatchingLabels{LabelUsedToken: "true"}); err != nil {
		return err
	}
	now := s.now()
	var errs []error
	for i := range leases.Items {
		l := &leases.Items[i]
		exp, err := time.Parse(time.RFC3339, l.Annotations[nsrequest.AnnotationExpiresAt])
		if err == nil && now.Before(exp.Add(pipelineid.DefaultSkew)) {
			continue
		}
		if err := s.client.Delete(ctx, l); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// addExchange adds the exchange's server and sweeper to the manager.
func addExchange(mgr ctrl.Manager, o *Options, policy *nsrequest.Policy, defaults *nsrequest.Defaults, verifier *pipelineid.Verifier) error {
	e := &exchanger{
		client: mgr.GetClient(), apiReader: mgr.GetAPIReader(),
		recorder: status.NewRecorder(mgr, "quartermaster-namespaces"), verifier: verifier, policy: policy, defaults: defaults,
		wait: exchangeWait, poll: 200 * time.Millisecond,
	}
	issuers := &issuerReconciler{
		client:   status.NewClient(mgr.GetClient(), &nsv1alpha1.TrustedIssuer{}),
		verifier: verifier, defaults: defaults,
	}
	issuers.step = status.Step{Client: issuers.client, Recorder: e.recorder}
	if err := issuers.setupWithManager(mgr); err != nil {
		return err
	}
	srv := &exchangeServer{addr: o.ExchangeAddress, certDir: o.ExchangeCertDir, handler: e, listening: o.exchangeListening, ready: &o.exchangeUp}
	if err := mgr.Add(srv); err != nil {
		return err
	}
	return mgr.Add(&usedTokenSweeper{client: mgr.GetClient(), namespace: policy.RequestsNamespace, every: time.Minute, now: time.Now})
}
