package mirror

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// AnnotationCacheReport holds a cache pod's note of its pins (CacheReport) on its own Pod. What a
// cache pod alone can see of its pins (the content it holds, the warms it ran) it notes there (the
// registry-mirror command's --report-to-pod, through the ownpod package): the controller reads
// every ready cache pod's note into the mirror's status (status.pinnedSize, the Warmed condition)
// and its Events. A cache pod's ServiceAccount (Install.CacheServiceAccount) may change only that
// Pod's registry.quartermaster.dev/ annotations.
const AnnotationCacheReport = "registry.quartermaster.dev/cache-report"

// Bounds of a report: it lives in an annotation, and says what a person reads in a condition.
const (
	MaxReportedFailures = 10
	maxFailureMessage   = 300
)

// CacheReport is one cache pod's note of its pins.
type CacheReport struct {
	// PinsHash is PinsHash of the pins file the pod read last ("" when it read none): the
	// controller tells a pod that has not read the current pins yet (the kubelet updates a
	// mounted ConfigMap within about a minute) from one that has.
	PinsHash string `json:"pinsHash"`
	// Pinned is how many images that file pins; Bytes what their content takes on the pod's
	// volume, counted at most every 30 s; OverHighWater whether that alone is above the volume's
	// high-water mark.
	Pinned        int   `json:"pinned"`
	Bytes         int64 `json:"bytes"`
	OverHighWater bool  `json:"overHighWater,omitempty"`
	// Warming is how many pinned images this pod fetches now or is about to (of the pins it
	// owns among the peers, those it does not hold); Failed the ones whose last fetch failed (at
	// most MaxReportedFailures, by image; FailedCount says how many in all), tried again later.
	Warming     int           `json:"warming,omitempty"`
	Failed      []WarmFailure `json:"failed,omitempty"`
	FailedCount int           `json:"failedCount,omitempty"`
}

// WarmFailure is a pinned image the cache could not fetch, and why (what the upstream or the
// volume answered; never a credential).
type WarmFailure struct {
	Image string `json:"image"`
	Error string `json:"error"`
}

// PinsHash identifies the content of a pins file.
func PinsHash(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// NewCacheReport is the report of a pod's state, its failures bounded: sorted by image, the first
// MaxReportedFailures kept, each message cut to a length a condition can carry.
func NewCacheReport(pinsHash string, pinned int, bytes int64, over bool, warming int, failed []WarmFailure) CacheReport {
	r := CacheReport{PinsHash: pinsHash, Pinned: pinned, Bytes: bytes, OverHighWater: over, Warming: warming, FailedCount: len(failed)}
	failed = slices.Clone(failed)
	slices.SortFunc(failed, func(a, b WarmFailure) int { return strings.Compare(a.Image, b.Image) })
	for _, f := range failed[:min(len(failed), MaxReportedFailures)] {
		if len(f.Error) > maxFailureMessage {
			f.Error = f.Error[:maxFailureMessage] + "…"
		}
		r.Failed = append(r.Failed, f)
	}
	return r
}

// Annotation is the report as the annotation's value.
func (r CacheReport) Annotation() string {
	b, _ := json.Marshal(r) //nolint:errchkjson // strings, numbers and bools only
	return string(b)
}

// ParseCacheReport reads a cache pod's annotation.
func ParseCacheReport(s string) (CacheReport, error) {
	var r CacheReport
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return CacheReport{}, fmt.Errorf("annotation %s: %w", AnnotationCacheReport, err)
	}
	return r, nil
}
