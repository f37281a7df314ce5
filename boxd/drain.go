package main

import (
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// After the process has exited, its output is read on until the pipes end, but not past a
// quiet moment nor past a bound while a background child of it keeps them open. Time the pumps
// wait for the node to take a frame (a slow client) is not quiet, and does not count toward
// drainMax while what is read is what the process itself left (drain, below).
const (
	drainQuiet = 200 * time.Millisecond
	drainMax   = 3 * time.Second
	drainTick  = 25 * time.Millisecond
)

// sendClock measures the time during which at least one pump waits for the node to take a
// frame (the union over the pumps, measured at each send, not sampled).
type sendClock struct {
	mu      sync.Mutex
	sending int           // pumps inside a send
	since   time.Time     // when `sending` last went from 0 to 1
	total   time.Duration // time with a send in flight, sends that have ended
	lastEnd time.Time     // when `sending` last went back to 0
}

func (c *sendClock) begin() {
	c.mu.Lock()
	if c.sending == 0 {
		c.since = time.Now()
	}
	c.sending++
	c.mu.Unlock()
}

func (c *sendClock) end() {
	c.mu.Lock()
	c.sending--
	if c.sending == 0 {
		c.lastEnd = time.Now()
		c.total += c.lastEnd.Sub(c.since)
	}
	c.mu.Unlock()
}

// at answers, at `now`: the time spent sending so far, whether a send is in flight, and when
// the last send ended.
func (c *sendClock) at(now time.Time) (spent time.Duration, busy bool, lastEnd time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	spent = c.total
	if c.sending > 0 {
		spent += now.Sub(c.since)
	}
	return spent, c.sending > 0, c.lastEnd
}

// unread is how many bytes wait in f (a pipe or a terminal master) for a read (FIONREAD);
// 0 when it cannot tell. It does not put f in blocking mode, as f.Fd() would.
func unread(f *os.File) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	var n int32
	if rc.Control(func(fd uintptr) {
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); e != 0 {
			n = 0
		}
	}) != nil {
		return 0
	}
	return int(n)
}

// capacity is what a process can leave in f when it exits: a pipe's size (F_GETPIPE_SZ: a
// process may have grown it), or for a terminal its line buffer and the tty layer's (4 KiB and
// 64 KiB in Linux), rounded up.
func capacity(f *os.File) int64 {
	const fallback = 128 << 10
	rc, err := f.SyscallConn()
	if err != nil {
		return fallback
	}
	size := int64(fallback)
	_ = rc.Control(func(fd uintptr) {
		if n, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, fGetPipeSz, 0); e == 0 && int64(n) > 0 {
			size = int64(n)
		}
	})
	return size
}

// fGetPipeSz is F_GETPIPE_SZ (Linux; not in package syscall).
const fGetPipeSz = 1032

// drain waits for the output pumps: to the end of the pipes, or a quiet moment, or drainMax.
//   - Quiet: no send in flight, nothing unread in the pipes (the pumps may not have been
//     scheduled yet on a loaded host) and no send ended for drainQuiet.
//   - drainMax: time not spent waiting for the node. What the process itself left in its pipes
//     is finite (their capacity): while no more than that has been read since its exit and some
//     is still unread, the bound waits (a pump the host has not scheduled loses nothing). Past
//     it, what comes is a background child's, and its sends count too: a child that writes on
//     to a slow reader does not hold the exec open for ever.
func (st *execState) drain() {
	done := make(chan struct{})
	go func() {
		st.outputs.Wait()
		close(done)
	}()
	start := time.Now()
	spentAtStart, _, _ := st.sends.at(start)
	readAtStart := atomic.LoadInt64(&st.read)
	var own int64
	for _, f := range st.outs {
		own += capacity(f)
	}
	ticks := st.drainTicks
	if ticks == nil {
		tick := time.NewTicker(drainTick)
		defer tick.Stop()
		ticks = tick.C
	}
	lastSeen := start // the last moment something was sent or waited to be read
	for {
		select {
		case <-done:
			return
		case <-ticks:
			now := time.Now() // not the tick's time: it may have waited (a loaded host)
			spent, busy, lastEnd := st.sends.at(now)
			unread := st.anyUnread()
			if busy || unread {
				lastSeen = now
			} else if lastEnd.After(lastSeen) {
				lastSeen = lastEnd
			}
			elapsed := now.Sub(start)
			ownLeft := atomic.LoadInt64(&st.read)-readAtStart <= own
			if ownLeft {
				elapsed -= spent - spentAtStart
			}
			if now.Sub(lastSeen) > drainQuiet || (elapsed > drainMax && !(ownLeft && unread)) {
				// Reads in flight end with the descriptors closed under them.
				st.closeOutputs()
				<-done
				return
			}
		}
	}
}

func (st *execState) pumpEnded(f *os.File) {
	st.endedMu.Lock()
	defer st.endedMu.Unlock()
	if st.ended == nil {
		st.ended = map[*os.File]bool{}
	}
	st.ended[f] = true
}

// anyUnread: whether a pump still running has bytes waiting in its pipe. One that has returned
// (its send failed: the node is gone) leaves what is there to no one, and it waits for nothing.
func (st *execState) anyUnread() bool {
	st.endedMu.Lock()
	defer st.endedMu.Unlock()
	for _, f := range st.outs {
		if !st.ended[f] && unread(f) > 0 {
			return true
		}
	}
	return false
}
