package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// releaseBinaryPages asks the kernel to reclaim the pages of the server's
// own executable that are resident now (madvise MADV_PAGEOUT on its
// read-only mappings), once start-up is over. Start-up touches most of
// the 60 MB binary (every package's initialisation, client-go's scheme,
// the AWS SDK's endpoint tables, etcd's packages), and those clean pages
// would otherwise stay resident and charged to the container's memory
// until the kernel runs short. What serving needs is read back from the
// image on first use. Pages another process maps stay; a kernel without
// MADV_PAGEOUT (before 5.4) returns an error and nothing changes.
func releaseBinaryPages() error {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || strings.Contains(fields[1], "w") {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			return fmt.Errorf("unexpected line in /proc/self/maps: %q", sc.Text())
		}
		// The raw system call: the range is not Go memory, so it is
		// never made into a slice.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_PAGEOUT); errno != 0 {
			return fmt.Errorf("madvise(MADV_PAGEOUT) on %s: %w", exe, errno)
		}
	}
	return sc.Err()
}
