package testenv

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// LogBuffer collects the logs a manager writes from many goroutines.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Tail returns at most the last n bytes, for failure messages.
func (l *LogBuffer) Tail(n int) string {
	s := l.String()
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// EventsAbout lists the events.k8s.io Events regarding obj.
func EventsAbout(t testing.TB, c client.Client, obj client.Object) []eventsv1.Event {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := c.List(context.Background(), list, client.InNamespace(obj.GetNamespace())); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.UID == obj.GetUID() {
			out = append(out, e)
		}
	}
	return out
}

// WaitForEvent waits up to a minute for an Event with the given reason about obj and returns it.
func WaitForEvent(t testing.TB, c client.Client, obj client.Object, reason string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	PollFor(t, "an Event "+reason+" about "+obj.GetName(), 50*time.Millisecond, time.Minute, func() (bool, string) {
		var seen []string
		for _, e := range EventsAbout(t, c, obj) {
			if e.Reason == reason {
				found = e
				return true, ""
			}
			seen = append(seen, e.Reason)
		}
		return false, "events: " + strings.Join(seen, ",")
	})
	return found
}

// Poll checks cond every interval until it holds, and fails the test with what and cond's last
// detail when a minute passes first. It returns the last detail.
func Poll(t testing.TB, what string, every time.Duration, cond func() (ok bool, detail string)) string {
	t.Helper()
	return PollFor(t, what, every, time.Minute, cond)
}

// PollFor is Poll with a limit of its own, for what takes longer than a minute by design (a
// rollout, a lease expiring, an engine's scan); the limit only bounds a failure, never a pass.
func PollFor(t testing.TB, what string, every, limit time.Duration, cond func() (ok bool, detail string)) string {
	t.Helper()
	last := ""
	err := wait.PollUntilContextTimeout(context.Background(), every, limit, true,
		func(context.Context) (bool, error) {
			ok, detail := cond()
			last = detail
			return ok, nil
		})
	if err != nil {
		t.Fatalf("timed out after %s waiting for %s (%s)", limit, what, last)
	}
	return last
}

// Eventually is Poll every 50 ms.
func Eventually(t testing.TB, what string, cond func() (ok bool, detail string)) {
	t.Helper()
	Poll(t, what, 50*time.Millisecond, cond)
}

// ErrString is err's message, or "" for nil: a detail for Poll.
func ErrString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// EventReasons takes the Events a FakeRecorder holds and returns their reasons, oldest first.
func EventReasons(rec *events.FakeRecorder) []string {
	var reasons []string
	for {
		select {
		case e := <-rec.Events:
			reasons = append(reasons, strings.Fields(e)[1])
		default:
			return reasons
		}
	}
}
