package main

// Service logs: what a service writes to stdout and stderr, appended to
// /var/log/boxes/<name>.log in the box, rotated to <name>.log.1 when it passes maxLogBytes, so
// a chatty service holds at most two files' worth of the box's disk.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

var logDir = "/var/log/boxes"

const maxLogBytes = 1 << 20

type rotatingLog struct {
	mu      sync.Mutex
	name    string
	dir     int // the log directory, checked (-1: not open)
	f       *os.File
	size    int64
	closed  bool
	checked time.Time
}

func newRotatingLog(name string) *rotatingLog { return &rotatingLog{name: name, dir: -1} }

func logPath(name string) string { return filepath.Join(logDir, name+".log") }

// openLogDir opens /var/log/boxes (made if missing) for boxd, root of the box, to write in: only
// a real directory (not a link) that root owns and nobody else may write, so that a box user who
// can write /var/log (a group-writable one) cannot point boxd's writes, renames and deletes
// elsewhere. The files in it are then reached relative to it, never by path.
func openLogDir() (int, error) {
	_ = os.MkdirAll(logDir, 0o755)
	fd, err := syscall.Open(logDir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Uid != 0 || st.Mode&0o022 != 0 {
		_ = syscall.Close(fd)
		return -1, fmt.Errorf("%s is not root's alone", logDir)
	}
	return fd, nil
}

// Write appends p; a write that fails (a full box, a log directory that is not root's) drops
// the output, never blocks the service. After close (the service deleted), output is dropped.
func (l *rotatingLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return len(p), nil
	}
	blocking(func() { l.append(p) })
	return len(p), nil
}

// append is Write's work on the files, under l.mu.
func (l *rotatingLog) append(p []byte) {
	cur := l.name + ".log"
	if l.f != nil && l.size+int64(len(p)) > maxLogBytes && l.size > 0 {
		_ = l.f.Close()
		l.f = nil
		_ = syscall.Renameat(l.dir, cur, l.dir, cur+".1")
	}
	if l.f != nil && time.Since(l.checked) > time.Second {
		// Removed or replaced under us (a rotation by hand): start a new file. Looked at once a
		// second at most.
		l.checked = time.Now()
		if !l.stillCurrent(cur) {
			_ = l.f.Close()
			l.f = nil
		}
	}
	if l.f == nil {
		if l.dir < 0 {
			fd, err := openLogDir()
			if err != nil {
				return
			}
			l.dir = fd
		}
		// Non-blocking: a FIFO put there by the box's root would wait for a reader (in a slot of
		// threads.go, holding l.mu); only a regular file is written.
		fd, err := syscall.Openat(l.dir, cur, syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0o600)
		if err != nil {
			return
		}
		f, err := regularOrClose(fd, cur, false)
		if err != nil {
			return
		}
		st, _ := f.Stat()
		l.f, l.size = f, 0
		if st != nil {
			l.size = st.Size()
		}
	}
	n, _ := l.f.Write(p)
	l.size += int64(n)
}

// stillCurrent says whether the open file is still the one named cur in the log directory.
func (l *rotatingLog) stillCurrent(cur string) bool {
	fd, err := syscall.Openat(l.dir, cur, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer syscall.Close(fd)
	var a, b syscall.Stat_t
	return syscall.Fstat(int(l.f.Fd()), &a) == nil && syscall.Fstat(fd, &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev
}

// copyFrom writes what r gives until it ends (every process holding the pipe has gone).
func (l *rotatingLog) copyFrom(r *os.File) {
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			_, _ = l.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// close ends the log for good (the service is deleted): later output is dropped.
func (l *rotatingLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
	if l.dir >= 0 {
		_ = syscall.Close(l.dir)
		l.dir = -1
	}
}

// removeLogs deletes the service's log files, in the checked log directory only.
func removeLogs(name string) {
	fd, err := openLogDir()
	if err != nil {
		return
	}
	defer syscall.Close(fd)
	_ = unlinkat(fd, name+".log")
	_ = unlinkat(fd, name+".log.1")
}

func unlinkat(dir int, name string) error {
	return syscall.Unlinkat(dir, name)
}

// readTail answers the last n lines of the service's log (the rotated file, then the current
// one), and the current file's identity and size, where a follow goes on from.
func readTail(name string, n int) ([]byte, *os.File, int64) {
	var all []byte
	var f *os.File
	var off int64
	blocking(func() {
		if b, err := readBounded(logPath(name) + ".1"); err == nil {
			all = b
		}
		var err error
		if f, err = openLog(logPath(name)); err == nil {
			b, _ := io.ReadAll(io.LimitReader(f, 2*maxLogBytes))
			off = int64(len(b))
			all = append(all, b...)
		}
	})
	return lastLines(all, n), f, off
}

// openLog opens a service log to read: a regular file only (never a FIFO's blocking open).
func openLog(p string) (*os.File, error) {
	return openRegular(p, syscall.O_RDONLY|syscall.O_NOFOLLOW, false)
}

func readBounded(p string) ([]byte, error) {
	f, err := openLog(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 2*maxLogBytes))
}

// lastLines is the end of b holding its last n lines (a last line without newline counts).
func lastLines(b []byte, n int) []byte {
	if n <= 0 {
		return nil
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	i := end
	for c := 0; c < n; c++ {
		j := bytes.LastIndexByte(b[:i], '\n')
		if j < 0 {
			return b
		}
		i = j
	}
	return b[i+1:]
}
