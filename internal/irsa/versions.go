package irsa

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxPolicyVersions is AWS's limit on the versions a managed policy keeps.
const maxPolicyVersions = 5

// PolicyVersion is a policy version as ListPolicyVersions returns it.
type PolicyVersion struct {
	ID        string
	IsDefault bool
	Created   time.Time
}

// VersionToPrune returns the version to delete before creating a new one. A managed policy keeps
// at most five versions and CreatePolicyVersion fails at the limit, so with five (or more) the
// controller deletes the oldest version not in force first. Age is by Created, ties broken by the
// number in the ID ("v9" before "v12"), then by ID, so the choice is deterministic. ok is false
// when there are fewer than five versions (nothing needs deleting) or none is non-default.
func VersionToPrune(versions []PolicyVersion) (id string, ok bool) {
	if len(versions) < maxPolicyVersions {
		return "", false
	}
	var oldest *PolicyVersion
	for i := range versions {
		v := &versions[i]
		if v.IsDefault {
			continue
		}
		if oldest == nil || olderVersion(*v, *oldest) {
			oldest = v
		}
	}
	if oldest == nil {
		return "", false
	}
	return oldest.ID, true
}

func olderVersion(a, b PolicyVersion) bool {
	if c := a.Created.Compare(b.Created); c != 0 {
		return c < 0
	}
	if c := cmp.Compare(versionNumber(a.ID), versionNumber(b.ID)); c != 0 {
		return c < 0
	}
	return a.ID < b.ID
}

// versionNumber is the number of a version ID such as "v12"; IDs that are not numbered sort last.
func versionNumber(id string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(strings.ToLower(id), "v"))
	if err != nil || n < 0 {
		return int(^uint(0) >> 1)
	}
	return n
}

// AttachmentDiff returns the managed policies to attach to a role (desired but not attached) and
// to detach (attached but not desired), each sorted and without duplicates, nil when empty. ARNs
// compare exactly, as IAM compares them.
func AttachmentDiff(current, desired []string) (attach, detach []string) {
	return missing(desired, current), missing(current, desired)
}

// missing returns the elements of a not in b, sorted and without duplicates.
func missing(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
