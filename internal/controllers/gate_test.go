package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// countingDiscovery serves one group version's resources, none until serve is called, and counts
// the questions of the Starter's Kinds: the test's barrier is a number of polls, never a time.
type countingDiscovery struct {
	discovery.DiscoveryInterface // only ServerResourcesForGroupVersion is called

	mu     sync.Mutex
	asked  int
	served *metav1.APIResourceList
}

func (d *countingDiscovery) ServerResourcesForGroupVersion(gv string) (*metav1.APIResourceList, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked++
	if d.served == nil || d.served.GroupVersion != gv {
		return nil, apierrors.NewNotFound(schema.GroupResource{}, gv)
	}
	return d.served, nil
}

func (d *countingDiscovery) polls() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked
}

func (d *countingDiscovery) serve(list *metav1.APIResourceList) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.served = list
}

// lines is a logr sink's output, one line per call, safe to read while the Starter logs.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, prefix+" "+args)
}

func (l *lines) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.all {
		if strings.Contains(s, substr) {
			n++
		}
	}
	return n
}

// TestStarterLogsAMissingKindOnceAndStartsWhenServed: a controller whose kind is not served is
// logged once however many times discovery is asked, and set up on the first poll that finds it.
func TestStarterLogsAMissingKindOnceAndStartsWhenServed(t *testing.T) {
	t.Parallel()
	gvk := schema.GroupVersionKind{Group: "example.quartermaster.dev", Version: "v1", Kind: "Widget"}
	d := &countingDiscovery{}
	logs := &lines{}
	setUp := make(chan struct{})
	log := funcr.New(logs.add, funcr.Options{})
	kinds := controllers.NewKindsWith(d, time.Millisecond, log)
	s := &controllers.Starter{
		Controller: controllers.Controller{Name: "widgets", Requires: []schema.GroupVersionKind{gvk},
			Setup: func(ctrl.Manager, *controllers.Kinds) error { close(setUp); return nil }},
		Kinds: kinds,
		Log:   log,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = kinds.Start(ctx) }()
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()

	testenv.PollFor(t, "ten polls of discovery", time.Millisecond, time.Minute, func() (bool, string) {
		n := d.polls()
		return n >= 10, fmt.Sprintf("%d polls", n)
	})
	if n := logs.count("waiting for the CustomResourceDefinition"); n != 1 {
		t.Errorf("the missing kind was logged %d times in %d polls, want once", n, d.polls())
	}
	d.serve(&metav1.APIResourceList{GroupVersion: gvk.GroupVersion().String(), APIResources: []metav1.APIResource{{Name: "widgets", Kind: "Widget"}}})
	if err := <-done; err != nil {
		t.Fatalf("Start: %v", err)
	}
	select {
	case <-setUp:
	default:
		t.Fatal("Start returned without setting the controller up")
	}
	if n := logs.count("required kinds are served now"); n != 1 {
		t.Errorf("the kind being served was logged %d times, want once", n)
	}
}
