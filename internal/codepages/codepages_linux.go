package codepages

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Release advises the kernel on the executable's read-only mappings (code, read-only data, the
// function table): MADV_RANDOM, so a later fault reads only the page it needs instead of a
// read-ahead window, then MADV_PAGEOUT, so the pages touched so far are dropped unless another
// process maps them too; then the file's pages nobody maps leave the page cache
// (POSIX_FADV_DONTNEED). Pages still in use are read back one at a time on their next access.
// Call it once start-up is over; it changes no behaviour, only which pages stay resident.
func Release() (Result, error) {
	var r Result
	exe, err := os.Stat("/proc/self/exe")
	if err != nil {
		return r, err
	}
	st, ok := exe.Sys().(*syscall.Stat_t)
	if !ok {
		return r, fmt.Errorf("no inode for /proc/self/exe")
	}
	path, _ := os.Readlink("/proc/self/exe")
	ranges, err := readOnlyMappings("/proc/self/maps", st.Ino, path)
	if err != nil {
		return r, err
	}
	if len(ranges) == 0 {
		return r, fmt.Errorf("no mapping of the executable %s (inode %d) in /proc/self/maps", path, st.Ino)
	}
	if r.FileBefore, err = rssFile(); err != nil {
		return r, err
	}
	for _, m := range ranges {
		for _, advice := range []uintptr{unix.MADV_RANDOM, unix.MADV_PAGEOUT} {
			if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, m.start, m.end-m.start, advice); errno != 0 {
				return r, fmt.Errorf("madvise(%#x-%#x, %d): %w", m.start, m.end, advice, errno)
			}
		}
		r.Ranges++
	}
	// The binary's pages still cached but mapped by nobody (read ahead, or left by whoever wrote
	// the file) would be mapped again by the kernel's fault-around whenever a neighbour is touched.
	if f, err := os.Open("/proc/self/exe"); err == nil {
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED) // advice: a refusal costs memory only
		f.Close()
	}
	r.FileAfter, err = rssFile()
	return r, err
}

type mapping struct{ start, end uintptr }

// readOnlyMappings lists the mappings of the executable, known by its inode ino or its path, that
// are not writable: the writable ones hold the binary's initialized variables, which the program
// may have changed. (Either may identify it: on an overlay file system the maps may show the
// inode of the layer below.)
func readOnlyMappings(maps string, ino uint64, path string) ([]mapping, error) {
	b, err := os.ReadFile(maps)
	if err != nil {
		return nil, err
	}
	var out []mapping
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// address perms offset dev inode [path]
		f := strings.Fields(sc.Text())
		if len(f) < 5 || strings.Contains(f[1], "w") {
			continue
		}
		n, err := strconv.ParseUint(f[4], 10, 64)
		if err != nil || n == 0 || (n != ino && (len(f) < 6 || path == "" || f[5] != path)) {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			return nil, fmt.Errorf("%s: malformed line %q", maps, sc.Text())
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: malformed line %q", maps, sc.Text())
		}
		out = append(out, mapping{uintptr(start), uintptr(end)})
	}
	return out, sc.Err()
}

// rssFile reads the process's resident file-backed bytes from /proc/self/status.
func rssFile() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no RssFile in /proc/self/status")
}
