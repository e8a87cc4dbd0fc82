// Package vsphere is the pure logic of the vmgroups controller: names of folders and VMs, which VMs
// belong to a group, and the plan that brings a group to its spec (scale, drift repair, rolling
// changes). It has no client; the controller observes vCenter, asks for a plan and carries it out.
package vsphere

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// MaxNameLength is vCenter's limit on inventory names (folders, VMs).
const MaxNameLength = 80

// Keys of the extraConfig entries written on every VM the operator clones. They mark the VM as the
// group's (only such VMs are ever changed or destroyed) and record the template and the
// first-boot data (a fingerprint, never the data) it came from.
const (
	KeyGroup    = "quartermaster.vmgroup"
	KeyTemplate = "quartermaster.template"
	KeyBoot     = "quartermaster.boot"
	// KeySnapshot records, on a linked clone, the name of the template's snapshot it was made
	// from (the one spec.snapshot named, or the template's current one).
	KeySnapshot = "quartermaster.snapshot"
	// KeyAddress records the static address a VM's network configuration was written with, before
	// its first power-on (a VM without it has not had its configuration yet).
	KeyAddress = "quartermaster.address"
)

// GroupKey is the value of KeyGroup for a VmGroup.
func GroupKey(namespace, name string) string { return namespace + "/" + name }

// FolderName is the name of a group's own folder, <namespace>-<name>. A name longer than vCenter
// allows is cut and suffixed with a hash of the whole, so it stays unique and deterministic.
func FolderName(namespace, name string) string {
	return fitName(namespace+"-"+name, namespace, name)
}

// fitName is full when vCenter allows it, else full cut and suffixed with a hash of the group's key.
func fitName(full, namespace, name string) string {
	if len(full) <= MaxNameLength {
		return full
	}
	sum := sha256.Sum256([]byte(GroupKey(namespace, name)))
	suffix := "-" + hex.EncodeToString(sum[:])[:10]
	return full[:MaxNameLength-len(suffix)] + suffix
}

// RuleName is the name of a group's DRS anti-affinity rule, quartermaster/<namespace>/<name>: the
// group's key, so no two groups share a rule. A name longer than vCenter allows is cut and suffixed
// with a hash of the whole, as FolderName does.
func RuleName(namespace, name string) string {
	return fitName("quartermaster/"+GroupKey(namespace, name), namespace, name)
}

// VMName is the name of the VM with the given ordinal: <group>-<ordinal>.
func VMName(group string, ordinal int) string { return group + "-" + strconv.Itoa(ordinal) }

// CompareVMNames orders the VM names of a group by ordinal (web-2 before web-10), other names
// after them by name.
func CompareVMNames(a, b string) int {
	an, aok := trailingOrdinal(a)
	bn, bok := trailingOrdinal(b)
	switch {
	case aok && bok && a[:strings.LastIndexByte(a, '-')] == b[:strings.LastIndexByte(b, '-')]:
		return cmp.Compare(an, bn)
	case aok != bok:
		if aok {
			return -1
		}
		return 1
	}
	return strings.Compare(a, b)
}

func trailingOrdinal(name string) (int, bool) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return 0, false
	}
	return Ordinal(name[:i], name)
}

// Ordinal parses a VM name made by VMName for group. Only the canonical form is accepted (no sign,
// no leading zeros), so every ordinal has exactly one name.
func Ordinal(group, vmName string) (int, bool) {
	s, ok := strings.CutPrefix(vmName, group+"-")
	if !ok || s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// ServerURL turns the Secret's VC_HOST (a host, host:port or URL) into the SDK endpoint URL.
// Errors never repeat the value: it may hold credentials someone pasted by mistake.
func ServerURL(host string) (*url.URL, error) {
	host = strings.TrimSpace(host)
	if host == "" {
		return nil, errors.New("VC_HOST is empty")
	}
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return nil, errors.New("VC_HOST is not a host, host:port or URL")
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, errors.New("VC_HOST must use https (or http)")
	case u.User != nil:
		return nil, errors.New("VC_HOST must not contain credentials; use VC_USER and VC_PASS")
	case u.Hostname() == "":
		return nil, errors.New("VC_HOST has no host name")
	case u.RawQuery != "" || u.Fragment != "":
		return nil, errors.New("VC_HOST must not have a query or fragment")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, errors.New("VC_HOST has an invalid port")
		}
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/sdk"
	}
	u.RawPath = ""
	return u, nil
}
