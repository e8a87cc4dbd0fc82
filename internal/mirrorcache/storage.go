package mirrorcache

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Owner is who the cache runs as (the StatefulSet's runAsUser and runAsGroup).
type Owner struct{ UID, GID int }

// PrepareStorage makes a fresh volume at dir writable by owner, for volumes whose provisioner
// ignores the Pod's fsGroup (the controller-manager's hostPath provisioner, several local ones):
// they arrive as an empty directory owned by root, mode 0750 or 0755, which the non-root cache
// cannot write. It runs as root with CAP_CHOWN alone (the StatefulSet's init container) and
// changes one thing, the owner of dir itself, and only when all of this holds:
//
//   - owner cannot write dir as it is (otherwise nothing is done: fsGroup worked, or the volume
//     was prepared before);
//   - dir is owned by root (a volume owned by someone else is theirs);
//   - dir is empty but for lost+found (a fresh volume: nobody's data changes owner);
//   - dir's owner bits allow writing and searching (chown alone then makes it writable: the
//     container has no CAP_FOWNER to change its mode).
//
// It reports what it did ("" when nothing was needed) or why it could not, naming the permission
// the cache lacks.
func PrepareStorage(dir string, owner Owner) (string, error) {
	st, err := statOwner(dir)
	if err != nil {
		return "", err
	}
	if st.writableBy(owner) {
		return "", nil
	}
	lacks := st.lacks(dir, owner)
	if st.uid != 0 {
		return "", fmt.Errorf("%s; it is owned by uid %d, not root: not changing the owner of a volume someone else owns", lacks, st.uid)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if e.Name() != "lost+found" {
			return "", fmt.Errorf("%s; it already holds %s: not changing the owner of a volume that holds data", lacks, e.Name())
		}
	}
	if st.mode&0o300 != 0o300 {
		return "", fmt.Errorf("%s; its mode %04o gives even its owner no write and search: the volume's provisioner must make it writable", lacks, st.mode)
	}
	if err := os.Chown(dir, owner.UID, owner.GID); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return "", fmt.Errorf("%s; changing its owner to %d:%d was refused (%w): the volume does not allow ownership changes (e.g. NFS with root_squash)",
				lacks, owner.UID, owner.GID, errors.Unwrap(err))
		}
		return "", err
	}
	return fmt.Sprintf("%s was owned by 0:%d, mode %04o, which uid %d cannot write (its provisioner ignores fsGroup): now owned by %d:%d",
		dir, st.gid, st.mode, owner.UID, owner.UID, owner.GID), nil
}

// CheckStorage tells whether the cache, running as this process's user, can write dir; if not, the
// error names what it lacks. The cache checks before it starts, so a volume it cannot write fails
// the container at once with that message (its termination message) instead of a fill at a time.
func CheckStorage(dir string) error {
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err == nil {
		name := f.Name()
		return errors.Join(f.Close(), os.Remove(name))
	}
	if !errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("the cache's volume at %s: %w", dir, err)
	}
	st, serr := statOwner(dir)
	if serr != nil {
		return fmt.Errorf("the cache's volume at %s: %w", dir, err)
	}
	return errors.New(st.lacks(dir, Owner{UID: os.Getuid(), GID: os.Getgid()}))
}

type ownership struct {
	uid, gid int
	mode     fs.FileMode
}

func statOwner(dir string) (ownership, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return ownership{}, err
	}
	if !fi.IsDir() {
		return ownership{}, fmt.Errorf("%s is not a directory", dir)
	}
	sys, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ownership{}, fmt.Errorf("%s: no owner information", dir)
	}
	return ownership{uid: int(sys.Uid), gid: int(sys.Gid), mode: fi.Mode().Perm()}, nil
}

// writableBy: owner may create files in the directory, by its mode bits (user, then group —
// the cache's group is also the Pod's fsGroup — then others).
func (o ownership) writableBy(owner Owner) bool {
	switch {
	case o.uid == owner.UID:
		return o.mode&0o300 == 0o300
	case o.gid == owner.GID:
		return o.mode&0o030 == 0o030
	default:
		return o.mode&0o003 == 0o003
	}
}

// lacks says which permission owner lacks on dir, in the terms a platform engineer checks.
func (o ownership) lacks(dir string, owner Owner) string {
	return fmt.Sprintf("the cache's volume at %s is not writable by uid %d (gid %d): it is owned by %d:%d, mode %04o",
		filepath.Clean(dir), owner.UID, owner.GID, o.uid, o.gid, o.mode)
}
