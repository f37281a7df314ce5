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
// What is left (a stat of /proc, a signal) is short and few; the spares cover it.

import (
	"runtime"
	"sync"
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
// fn must not itself wait for a slot, a lock or the node.
func blocking(fn func()) {
	blockingSlots <- struct{}{}
	defer func() { <-blockingSlots }()
	fn()
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
