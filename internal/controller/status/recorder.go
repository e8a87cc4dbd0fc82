package status

import (
	"fmt"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
)

// MaxEventNote is the longest note the API server stores in an Event (events.k8s.io/v1 refuses a
// longer one, and the recorder drops the Event with it).
const MaxEventNote = 1024

// NewRecorder is the manager's Event recorder for a controller, with every note cut to
// MaxEventNote: an engine's full refusal or a cloud error is often longer, and an Event dropped
// is a failure nobody sees where they look first.
func NewRecorder(mgr ctrl.Manager, name string) events.EventRecorder {
	return truncating{mgr.GetEventRecorder(name)}
}

// truncating cuts each Event's note to MaxEventNote.
type truncating struct{ events.EventRecorder }

func (r truncating) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, action, "%s", Truncate(fmt.Sprintf(note, args...), MaxEventNote))
}

// Truncate cuts s to at most limit bytes, on a rune boundary, ending in "…" when cut.
func Truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	const ellipsis = "…"
	cut := limit - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
