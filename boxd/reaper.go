package main

import (
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
)

// Reaper is PID 1's wait loop: every child that ends is reaped here, ours (whose status an
// exec waits for) and orphans re-parented to PID 1 alike. A process is started under the
// same lock the loop reaps under, so no status is reaped before its waiter is registered.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	sigs    chan os.Signal
}

// NewReaper subscribes to SIGCHLD at once, before any child can exist: a signal that came
// before the subscription would be dropped, and with no timer nothing would reap that child
// (a boot service that exits at once would show running for ever).
func NewReaper() *Reaper {
	r := &Reaper{waiters: map[int]chan syscall.WaitStatus{}, sigs: make(chan os.Signal, 128)}
	signal.Notify(r.sigs, syscall.SIGCHLD)
	return r
}

// Start runs start (which forks) and registers the child's pid; the channel gets its status.
// childOOMScoreAdj is every process boxd starts (execs, services, the main process); boxd keeps
// the box's own value (workers/runtime/ociSpec.ts BOX_OOM_SCORE_ADJ, 800).
const childOOMScoreAdj = "1000"

func (r *Reaper) Start(start func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return 0, nil, err
	}
	// A likelier OOM victim than boxd itself: a box short of memory (a fork bomb in a small box)
	// loses one of its processes, not its PID 1. Raising is allowed unprivileged; the pid is
	// still this child's (reaping waits for the lock held here).
	// (Not in a slot of threads.go: r.mu already lets one such write run at a time, and a start
	// must not wait behind file transfers.)
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(childOOMScoreAdj), 0)
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

// Run reaps once, then on every SIGCHLD. Once subscribed (NewReaper), a SIGCHLD merged with
// another (the kernel's pending signal, the runtime's, or a full channel) loses no child: each
// delivery is followed by a reapAll that waits for every zombie there is, and a child that
// exits after a delivery raises a new signal. No timer: a second's tick woke every idle boxd
// (≈9 context switches a second each, 0.29 ms of CPU a second per box on the host; ≈1 and
// 0.03 ms without, docs/decisions.md "What a node does per box, at scale").
func (r *Reaper) Run() {
	r.reapAll()
	for range r.sigs {
		r.reapAll()
	}
}

func (r *Reaper) reapAll() {
	for {
		r.mu.Lock()
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			r.mu.Unlock()
			continue
		}
		if pid <= 0 || err != nil {
			r.mu.Unlock()
			return
		}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws
		}
		r.mu.Unlock()
	}
}

// Children is how many processes other than PID 1 the box still has.
func Children() int {
	d, err := os.Open("/proc")
	if err != nil {
		return 0
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	n := 0
	self := os.Getpid()
	for _, name := range names {
		if pid, err := strconv.Atoi(name); err == nil && pid > 0 && pid != self {
			n++
		}
	}
	return n
}
