package main

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// ioctl on a file without os.File.Fd, which would put the descriptor in blocking mode (and a
// read blocked in the kernel could then not be ended by closing it).
func ioctl(f *os.File, req uintptr, arg uintptr) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, arg)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// openPty makes a terminal in the box's own devpts: the master for boxd, the slave (owned by
// the user, like login's) for the process. Echo is off unless asked for, so that what comes
// back is only what the program writes.
func openPty(cols, rows uint16, echo bool, uid, gid int) (*os.File, *os.File, error) {
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	unlock := 0
	if err := ioctl(ptm, syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
		ptm.Close()
		return nil, nil, fmt.Errorf("unlockpt: %w", err)
	}
	var n uint32
	if err := ioctl(ptm, syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); err != nil {
		ptm.Close()
		return nil, nil, fmt.Errorf("ptsname: %w", err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		ptm.Close()
		return nil, nil, err
	}
	_ = pts.Chown(uid, gid)
	_ = pts.Chmod(0o620)
	var t syscall.Termios
	if err := ioctl(pts, syscall.TCGETS, uintptr(unsafe.Pointer(&t))); err == nil {
		if echo {
			t.Lflag |= syscall.ECHO
		} else {
			t.Lflag &^= syscall.ECHO
		}
		_ = ioctl(pts, syscall.TCSETS, uintptr(unsafe.Pointer(&t)))
	}
	if err := setWinsize(ptm, cols, rows); err != nil {
		ptm.Close()
		pts.Close()
		return nil, nil, err
	}
	return ptm, pts, nil
}

type winsize struct {
	Row, Col, X, Y uint16
}

func setWinsize(f *os.File, cols, rows uint16) error {
	ws := winsize{Row: rows, Col: cols}
	return ioctl(f, syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws)))
}
