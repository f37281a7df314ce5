package main

// Threads kept ahead. Go's runtime starts an OS thread whenever a goroutine sits in a blocking
// syscall (a read or write of a regular file, above all) while another goroutine needs to run,
// and when that clone fails it ends the process ("runtime: failed to create new OS thread", a
// throw, not an error a caller sees). A thread counts against the box's pids limit like any
// process in the box, so a box whose processes hold every pid it may have (a fork bomb, or
// thousands of sleeping workers) lost its PID 1 to the next burst of file calls: the box's
// processes gone, the box restarted by its node's agent watchdog. Seen: 30 downloads at once
// from a box whose fork bomb held its 4096 pids (7 answered 503, then the box restarted), and
// the bomb's own exec answered 503 under load in the suite.
//
// So boxd makes the threads it may need while pids are still free (keepThreads, at start: Go
// keeps an idle thread for later, it never ends one), runs Go code on at most serveProcs
// threads at once (GOMAXPROCS: on a 64-core host the runtime would otherwise start up to 64
// threads for runnable goroutines), and lets at most maxBlocking goroutines into a blocking
// file syscall at once (blocking): the others wait their turn parked, which takes no thread.
// What is left (a stat of the exec path, /etc/passwd, a symlink's target) is short and few; the
// spares cover it. Pipes, sockets, FIFOs and the pty's master are read through Go's poller and
// take no thread while they wait.

import (
	"errors"
	"io/fs"
	"os"
	"runtime"
	"sync"
	"syscall"
)

const (
	serveProcs  = 2
	maxBlocking = 8
	// Threads in all: one per P running Go code, one per goroutine in a blocking call, the
	// runtime's own (sysmon, the template thread, a spinning one per P) and room for the
	// short calls not counted by blocking.
	spareThreads = serveProcs + maxBlocking + 2*serveProcs + 2 + 8
)

var blockingSlots = make(chan struct{}, maxBlocking)

// blocking runs fn, a call that may block in the kernel on a file (a regular file's read or
// write, an open, a stat, a rename, a directory walk), once one of maxBlocking slots is free.
// fn must not itself wait for a slot, a lock or the node, nor for ever: an open that could wait
// for a writer (a FIFO) is made non-blocking (openRegular), so a few such paths cannot take
// every slot.
func blocking(fn func()) {
	blockingSlots <- struct{}{}
	defer func() { <-blockingSlots }()
	fn()
}

// openRegular opens p (flags without O_NONBLOCK) only if it is a regular file (or, with dirOK,
// a directory), checked on what was opened: a FIFO or a device at p is not opened for good (an
// open of a FIFO waits for its other end; done non-blocking here, it cannot). The file is back
// in blocking mode for its reads and writes. Anything else answers errNotRegular.
func openRegular(p string, flags int, dirOK bool) (*os.File, error) {
	fd, err := syscall.Open(p, flags|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return regularOrClose(fd, p, dirOK)
}

// errNotRegular: a path that is not a regular file (nor a directory, where one is taken).
var errNotRegular = errors.New("not a regular file")

// regularOrClose is fd (opened non-blocking) as a file in blocking mode if it is a regular file
// (or, with dirOK, a directory); otherwise fd is closed.
func regularOrClose(fd int, p string, dirOK bool) (*os.File, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		_ = syscall.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	if t := st.Mode & syscall.S_IFMT; t != syscall.S_IFREG && !(dirOK && t == syscall.S_IFDIR) {
		_ = syscall.Close(fd)
		return nil, errNotRegular
	}
	if err := syscall.SetNonblock(fd, false); err != nil {
		_ = syscall.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// keepThreads makes the runtime start n threads now: n goroutines each locked to its own
// thread, all parked at once, so each thread is a different one; once unlocked they go back to
// the runtime's idle threads, where they stay.
func keepThreads(n int) {
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	for i := 0; i < n; i++ {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			ready.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	ready.Wait()
	close(release)
	done.Wait()
}
