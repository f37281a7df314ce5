package main

// Uploads to a FUSE root (zfs-fuse here) are written with O_DIRECT. A buffered write to FUSE
// copies every block into the kernel's page cache (charged to the box's memory) and sends it
// to the daemon 128 KiB at a time, one request after another; an O_DIRECT write sends the
// block's own pages, and the kernel keeps several requests of one write in flight when the
// daemon allows it (async direct I/O). Measured (docs/decisions.md "Uploads to a FUSE root
// bypass the page cache"): 256 MiB through the api 906 -> 670 ms p50, boxd's CPU 270 -> 150 ms.
//
// Only FUSE: FUSE has no alignment rule for direct I/O, and its page cache sits in front of a
// daemon with a cache of its own (the ARC). On a kernel filesystem O_DIRECT has rules of its
// own (alignment, and on OpenZFS ≥ 2.3 the ARC bypassed), so such a root keeps buffered writes.

import (
	"os"
	"syscall"
)

// fuseSuperMagic is FUSE_SUPER_MAGIC, statfs(2)'s f_type of a FUSE filesystem.
const fuseSuperMagic = 0x65735546

// writeDirectOnFuse turns O_DIRECT on for fh when it is a file on a FUSE filesystem; whether
// it did. Anything that stops it (another filesystem, a kernel that refuses) leaves fh as it
// was: buffered writes are always right, only slower. A direct write refused later (EINVAL)
// turns it off again and is written buffered (writeFile).
func writeDirectOnFuse(fh *os.File) bool {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(fh.Fd()), &st); err != nil || uint32(st.Type) != fuseSuperMagic {
		return false
	}
	return setDirect(fh, true)
}

// setDirect turns O_DIRECT on or off for fh; whether it did.
func setDirect(fh *os.File, on bool) bool {
	fl, err := fcntl(fh.Fd(), syscall.F_GETFL, 0)
	if err != nil {
		return false
	}
	if on {
		fl |= syscall.O_DIRECT
	} else {
		fl &^= syscall.O_DIRECT
	}
	_, err = fcntl(fh.Fd(), syscall.F_SETFL, fl)
	return err == nil
}

func fcntl(fd uintptr, cmd, arg int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, uintptr(cmd), uintptr(arg))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
