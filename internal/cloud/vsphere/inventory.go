package vsphere

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"

	domain "github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// Placement names where a group's VMs go; empty fields take vCenter's defaults (the only
// datacenter, the datacenter's VM folder, the only resource pool, the template's datastore and
// network).
type Placement struct {
	Datacenter   string
	Folder       string // parent of the group's folder: an inventory path, or relative to the datacenter's VM folder
	ResourcePool string
	Datastore    string
	Network      string
}

// Folder is a group's folder.
type Folder struct {
	ID      string // managed object id, e.g. group-v42
	Path    string // inventory path
	Created bool   // made by this call
}

func (f Folder) ref() types.ManagedObjectReference {
	return types.ManagedObjectReference{Type: "Folder", Value: f.ID}
}

// Listing is the content of a group's folder.
type Listing struct {
	VMs []domain.VM
	// Others counts children that are not VMs (sub-folders, vApps): a folder holding any is kept.
	Others int
}

// vmProperties are what a listing reads of each VM.
var vmProperties = []string{
	"name", "runtime.powerState", "guest.ipAddress", "guest.net", "guest.toolsRunningStatus",
	"config.hardware.numCPU", "config.hardware.memoryMB", "config.template", "config.extraConfig",
}

// FolderPath is the inventory path of the folder called name under the placement's parent folder.
func (c *Client) FolderPath(ctx context.Context, p Placement, name string) (string, error) {
	if strings.HasPrefix(p.Folder, "/") {
		return strings.TrimRight(p.Folder, "/") + "/" + name, nil
	}
	dc, err := c.datacenterName(ctx, p.Datacenter)
	if err != nil {
		return "", err
	}
	parent := "/" + dc + "/vm"
	if rel := strings.Trim(p.Folder, "/"); rel != "" {
		parent += "/" + rel
	}
	return parent + "/" + name, nil
}

// datacenterName returns name, or the only datacenter's name when name is empty (looked up once).
func (c *Client) datacenterName(ctx context.Context, name string) (string, error) {
	if name != "" {
		return name, nil
	}
	c.dcMu.Lock()
	defer c.dcMu.Unlock()
	if c.defaultDC != "" {
		return c.defaultDC, nil
	}
	dc, err := find.NewFinder(c.vim).DefaultDatacenter(ctx)
	if err != nil {
		return "", c.redact(lookupError(err, "datacenter", ""))
	}
	c.defaultDC = dc.Name()
	return c.defaultDC, nil
}

// Folder finds the folder at inventory path p. With create it makes the folder when missing (not
// its parent: a missing parent is a NotFoundError).
func (c *Client) Folder(ctx context.Context, p string, create bool) (Folder, error) {
	si := object.NewSearchIndex(c.vim)
	ref, err := si.FindByInventoryPath(ctx, p)
	if err != nil {
		return Folder{}, c.redact(err)
	}
	if ref != nil {
		if ref.Reference().Type != "Folder" {
			return Folder{}, &InvalidError{Kind: "folder", Name: p, Problem: "a " + ref.Reference().Type + " has this path, not a folder"}
		}
		return Folder{ID: ref.Reference().Value, Path: p}, nil
	}
	if !create {
		return Folder{}, &NotFoundError{Kind: "folder", Name: p}
	}
	parent, name := path.Dir(p), path.Base(p)
	pref, err := si.FindByInventoryPath(ctx, parent)
	if err != nil {
		return Folder{}, c.redact(err)
	}
	if pref == nil || pref.Reference().Type != "Folder" {
		return Folder{}, &NotFoundError{Kind: "folder", Name: parent}
	}
	f, err := object.NewFolder(c.vim, pref.Reference()).CreateFolder(ctx, name)
	if fault.Is(err, &types.DuplicateName{}) {
		return c.Folder(ctx, p, false) // made meanwhile by someone else
	}
	if err != nil {
		return Folder{}, c.redact(err)
	}
	return Folder{ID: f.Reference().Value, Path: p, Created: true}, nil
}

// List reads the folder's VMs in one property collector call (more only past vCenter's page size).
func (c *Client) List(ctx context.Context, f Folder) (Listing, error) {
	no := false
	req := types.RetrievePropertiesEx{
		This: c.vim.ServiceContent.PropertyCollector,
		SpecSet: []types.PropertyFilterSpec{{
			ObjectSet: []types.ObjectSpec{{
				Obj:       f.ref(),
				SelectSet: []types.BaseSelectionSpec{&types.TraversalSpec{Type: "Folder", Path: "childEntity", Skip: &no}},
			}},
			PropSet: []types.PropertySpec{
				{Type: "Folder", PathSet: []string{"childEntity"}},
				{Type: "VirtualMachine", PathSet: vmProperties},
			},
		}},
	}
	objects, err := mo.RetrievePropertiesEx(ctx, c.vim, req)
	if IsGone(err) {
		return Listing{}, &NotFoundError{Kind: "folder", Name: f.Path}
	}
	if err != nil {
		return Listing{}, c.redact(err)
	}
	var l Listing
	for _, o := range objects {
		switch {
		case o.Obj == f.ref():
			for _, p := range o.PropSet {
				if children, ok := p.Val.(types.ArrayOfManagedObjectReference); ok {
					for _, child := range children.ManagedObjectReference {
						if child.Type != "VirtualMachine" {
							l.Others++
						}
					}
				}
			}
		case o.Obj.Type == "VirtualMachine":
			// A property vCenter could not read (no permission, say) must not look like a VM
			// that is not the group's, or missing.
			if len(o.MissingSet) > 0 {
				m := o.MissingSet[0]
				return Listing{}, c.redact(fmt.Errorf("reading %s of %s: %s", m.Path, o.Obj.Value, faultName(m.Fault)))
			}
			l.VMs = append(l.VMs, toVM(o))
		}
	}
	return l, nil
}

// toVM reads a VM's properties; missing ones (an inaccessible VM) stay zero.
func toVM(o types.ObjectContent) domain.VM {
	vm := domain.VM{ID: o.Obj.Value}
	template := false
	for _, p := range o.PropSet {
		switch p.Name {
		case "name":
			vm.Name, _ = p.Val.(string)
		case "runtime.powerState":
			if s, ok := p.Val.(types.VirtualMachinePowerState); ok {
				vm.PowerState = domain.PowerState(s)
			}
		case "guest.ipAddress":
			vm.IP, _ = p.Val.(string)
		case "guest.net":
			if nics, ok := p.Val.(types.ArrayOfGuestNicInfo); ok {
				for _, nic := range nics.GuestNicInfo {
					vm.IPs = append(vm.IPs, nic.IpAddress...)
				}
			}
		case "guest.toolsRunningStatus":
			s, _ := p.Val.(string)
			vm.ToolsRunning = s == string(types.VirtualMachineToolsRunningStatusGuestToolsRunning)
		case "config.hardware.numCPU":
			vm.CPU, _ = p.Val.(int32)
		case "config.hardware.memoryMB":
			vm.MemoryMB, _ = p.Val.(int32)
		case "config.template":
			template, _ = p.Val.(bool)
		case "config.extraConfig":
			if opts, ok := p.Val.(types.ArrayOfOptionValue); ok {
				for _, bo := range opts.OptionValue {
					ov := bo.GetOptionValue()
					v, _ := ov.Value.(string)
					switch ov.Key {
					case domain.KeyGroup:
						vm.Group = v
					case domain.KeyTemplate:
						vm.Template = v
					case domain.KeyBoot:
						vm.Boot = v
					case domain.KeyDisks:
						vm.Disks = domain.ParseDisks(v)
					case domain.KeySnapshot:
						vm.Snapshot = v
					case domain.KeyAddress:
						vm.Address = v
					}
				}
			}
		}
	}
	if template {
		vm.Group = "" // a template is never a member, even if someone converted one of ours
	}
	return vm
}

// DestroyFolder removes the folder; one already gone is not an error. vCenter destroys a folder's
// content with it, so the caller makes sure it is empty.
func (c *Client) DestroyFolder(ctx context.Context, f Folder) error {
	task, err := object.NewFolder(c.vim, f.ref()).Destroy(ctx)
	if err == nil {
		err = task.Wait(ctx)
	}
	if IsGone(err) {
		return nil
	}
	return c.redact(err)
}

// lookupError turns the finder's errors about item kind into a NotFoundError or an InvalidError;
// name "" is the default item.
func lookupError(err error, kind, name string) error {
	var nf *find.NotFoundError
	var dnf *find.DefaultNotFoundError
	var mf *find.MultipleFoundError
	var dmf *find.DefaultMultipleFoundError
	switch {
	case errors.As(err, &nf) || errors.As(err, &dnf):
		return &NotFoundError{Kind: kind, Name: name}
	case errors.As(err, &dmf):
		return &InvalidError{Kind: kind, Name: name, Problem: fmt.Sprintf(
			"several exist; name one in spec.placement or with the operator's --vsphere-%s flag", strings.ReplaceAll(kind, " ", "-"))}
	case errors.As(err, &mf):
		return &InvalidError{Kind: kind, Name: name, Problem: "the name matches several; give an inventory path"}
	}
	return err
}

func faultName(f types.LocalizedMethodFault) string {
	if f.LocalizedMessage != "" {
		return f.LocalizedMessage
	}
	return fmt.Sprintf("%T", f.Fault)
}
