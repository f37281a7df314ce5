package main

import (
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// After the process has exited, its output is read on until the pipes end, but not past a
// quiet moment nor past a bound while a background child of it keeps them open. Both count only
// the process's side: time the pumps wait for the node to take a frame (a slow client) is not
// quiet and does not count toward drainMax, or a slow reader would lose the output's end.
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

// drain waits for the output pumps: to the end of the pipes, or a quiet moment, or drainMax.
// Quiet means no send in flight, nothing unread in the pipes (the pumps may not have been
// scheduled yet on a loaded host) and no send ended for drainQuiet.
func (st *execState) drain() {
	done := make(chan struct{})
	go func() {
		st.outputs.Wait()
		close(done)
	}()
	start := time.Now()
	spentAtStart, _, _ := st.sends.at(start)
	tick := time.NewTicker(drainTick)
	defer tick.Stop()
	lastSeen := start // the last moment something was sent or waited to be read
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			spent, busy, lastEnd := st.sends.at(now)
			if busy || st.anyUnread() {
				lastSeen = now
			} else if lastEnd.After(lastSeen) {
				lastSeen = lastEnd
			}
			processTime := now.Sub(start) - (spent - spentAtStart)
			if now.Sub(lastSeen) > drainQuiet || processTime > drainMax {
				// Reads in flight end with the descriptors closed under them.
				st.closeOutputs()
				<-done
				return
			}
		}
	}
}

func (st *execState) anyUnread() bool {
	for _, f := range st.outs {
		if unread(f) > 0 {
			return true
		}
	}
	return false
}
