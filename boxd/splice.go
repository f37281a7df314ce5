package main

// A file read sent without passing through boxd's memory: splice(2) moves a block of the file's
// page cache into a pipe (page references), its data frame's header is written, and the block
// moves on from the pipe into the node's unix socket (references again, on Linux ≥ 6.5). The
// node then reads the bytes once, where a read(2) and a write(2) here copied them twice more.

import (
	"errors"
	"net"
	"os"
	"syscall"
)

// fSetPipeSz is F_SETPIPE_SZ (not in Go's syscall package).
const fSetPipeSz = 1031

// errNoSplice: the file or the connection cannot be spliced (nothing was sent); the caller
// copies instead.
var errNoSplice = errors.New("splice not possible")

// spliceData sends fh from its offset to its end as FrameData frames of at most block bytes on
// c (w's connection, locked for each frame). fillErr is the file's failure, sendErr the
// connection's; errNoSplice as fillErr when the first block could not be spliced (nothing sent).
func spliceData(fh *os.File, c net.Conn, w *Writer, block int) (fillErr, sendErr error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return errNoSplice, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return errNoSplice, nil
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return errNoSplice, nil
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	// A pipe holds 64 KiB unless told more (up to fs.pipe-max-size, 1 MiB by default).
	if size, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(p[1]), fSetPipeSz, uintptr(block)); e != 0 {
		block = 64 << 10
	} else if int(size) < block {
		block = int(size)
	}
	src := int(fh.Fd())
	for first := true; ; first = false {
		// Into the pipe: its reads wait on the file's daemon (a FUSE root), so in a slot.
		var n int64
		var err error
		blocking(func() {
			for {
				n, err = syscall.Splice(src, nil, p[1], nil, block, spliceMove)
				if err != syscall.EINTR {
					return
				}
			}
		})
		if err != nil {
			if first && (err == syscall.EINVAL || err == syscall.ENOSYS) {
				return errNoSplice, nil
			}
			return &os.PathError{Op: "read", Path: fh.Name(), Err: err}, nil
		}
		if n == 0 {
			return nil, nil // the end of the file
		}
		if err := w.frameOf(FrameData, int(n), func() error { return spliceOut(raw, p[0], int(n)) }); err != nil {
			return nil, err
		}
	}
}

// spliceMove: SPLICE_F_MOVE (a hint; the kernel moves pages where it can).
const spliceMove = 0x1

// spliceNonblock: SPLICE_F_NONBLOCK, for the pipe side of a move into the (non-blocking) socket.
const spliceNonblock = 0x2

// spliceOut moves n bytes from the pipe r into the connection, waiting for room as a write does.
func spliceOut(raw syscall.RawConn, r, n int) error {
	var werr error
	err := raw.Write(func(fd uintptr) bool {
		for n > 0 {
			m, e := syscall.Splice(r, nil, int(fd), nil, n, spliceMove|spliceNonblock)
			switch {
			case e == syscall.EINTR:
				continue
			case e == syscall.EAGAIN:
				return false // the socket is full: wait until it takes more
			case e != nil:
				werr = e
				return true
			case m == 0:
				werr = syscall.EPIPE
				return true
			}
			n -= int(m)
		}
		return true
	})
	if err != nil {
		return err
	}
	return werr
}
