package main

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"
)

// sink stands for the node's end of the connection: it keeps what it is sent, and can be slow.
type sink struct {
	mu    sync.Mutex
	got   bytes.Buffer
	fail  bool          // every write fails (a node that is gone)
	delay time.Duration // how long the first write waits (a node whose client does not read)
	each  time.Duration // how long every write waits (a slow reader)
	first bool
}

func (s *sink) Write(p []byte) (int, error) {
	if s.fail {
		return 0, os.ErrClosed
	}
	s.mu.Lock()
	wait := !s.first
	s.first = true
	s.mu.Unlock()
	if wait {
		time.Sleep(s.delay)
	}
	time.Sleep(s.each)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got.Write(p)
}

// payload is what the sink got, frame headers taken off.
func (s *sink) payload(t *testing.T) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []byte
	r := bytes.NewReader(s.got.Bytes())
	for r.Len() > 0 {
		f, err := ReadFrame(r)
		if err != nil {
			t.Fatalf("a frame the sink cannot read: %v", err)
		}
		out = append(out, f.Payload...)
	}
	return out
}

// exited makes the state of a process that has exited with `data` left in its stdout pipe,
// whose write end stays open when `held` (a background child of it).
func exited(t *testing.T, data []byte, s *sink, held bool) (*execState, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if !held {
		_ = w.Close()
	}
	t.Cleanup(func() {
		_ = w.Close()
		_ = r.Close()
	})
	st := &execState{w: &Writer{w: s}, req: &ExecRequest{}, outs: []*os.File{r}}
	st.outputs.Add(1)
	return st, w
}

// A pump not yet scheduled when the drain starts (a loaded host) finds the output still there:
// what waits unread in the pipe is not a quiet moment.
func TestDrainWaitsForUnreadOutput(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 10_000)
	s := &sink{}
	st, _ := exited(t, data, s, false)
	go func() {
		time.Sleep(3 * drainQuiet)
		st.pump(st.outs[0], FrameStdout)
	}()
	st.drain()
	if got := s.payload(t); len(got) != len(data) {
		t.Fatalf("the drain cut the output: %d bytes of %d", len(got), len(data))
	}
}

// A node that takes its frames slowly (its client does not read) is not the process keeping
// the drain: the time a send waits counts toward neither bound, however long, and however
// late the drain's ticks come (a loaded host: here 1 s apart).
func TestDrainDoesNotCountTheNodesTime(t *testing.T) {
	data := bytes.Repeat([]byte("y"), outputBuf+1000) // two reads, the pipe holding both
	s := &sink{delay: drainMax + 2*time.Second}
	st, _ := exited(t, data, s, false)
	late := time.NewTicker(time.Second)
	defer late.Stop()
	st.drainTicks = late.C
	go st.pump(st.outs[0], FrameStdout)
	st.drain()
	if got := s.payload(t); len(got) != len(data) {
		t.Fatalf("the drain cut the output: %d bytes of %d", len(got), len(data))
	}
}

// A background child that holds the pipe open and writes nothing: the drain ends after a quiet
// moment, with what was there sent.
func TestDrainEndsOnAQuietPipe(t *testing.T) {
	s := &sink{}
	st, _ := exited(t, []byte("before\n"), s, true)
	go st.pump(st.outs[0], FrameStdout)
	t0 := time.Now()
	st.drain()
	if d := time.Since(t0); d < drainQuiet || d > drainMax {
		t.Fatalf("the drain of a quiet pipe took %v (quiet bound %v)", d, drainQuiet)
	}
	if got := string(s.payload(t)); got != "before\n" {
		t.Fatalf("sent %q", got)
	}
}

// drainOfAWriterThatGoesOn: how long the drain takes while a background child writes on into
// the pipe, in chunks of `chunk` bytes, to the node `s`.
func drainOfAWriterThatGoesOn(t *testing.T, s *sink, chunk int) time.Duration {
	st, w := exited(t, []byte("a"), s, true)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		b := bytes.Repeat([]byte("z"), chunk)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := w.Write(b); err != nil {
				return
			}
		}
	}()
	go st.pump(st.outs[0], FrameStdout)
	t0 := time.Now()
	st.drain()
	return time.Since(t0)
}

// drainSlack: how far past drainMax a drain may end and still count as ending at its bound (one
// that never ends is the failure). Generous: on a loaded 2-core VM in CI, 2 s was passed by 40 ms
// while the whole suite ran beside it.
const drainSlack = 6 * time.Second

// A background child that writes on and on: the drain ends at drainMax.
func TestDrainEndsAtItsBoundOnAWriterThatGoesOn(t *testing.T) {
	if d := drainOfAWriterThatGoesOn(t, &sink{}, 512); d < drainMax || d > drainMax+drainSlack {
		t.Fatalf("the drain of a writer that goes on took %v (bound %v)", d, drainMax)
	}
}

// A background child that writes on to a slow reader: past what the process could have left in
// its pipe, the time its sends wait counts too, and the drain ends at drainMax.
func TestDrainEndsAtItsBoundOnAWriterThatGoesOnToASlowNode(t *testing.T) {
	if d := drainOfAWriterThatGoesOn(t, &sink{each: 20 * time.Millisecond}, 4096); d < drainMax || d > drainMax+drainSlack {
		t.Fatalf("the drain of a writer that goes on to a slow node took %v (bound %v)", d, drainMax)
	}
}

// Output a late pump finds is not cut by drainMax either while it is what the process left.
func TestDrainWaitsPastItsBoundForWhatTheProcessLeft(t *testing.T) {
	data := bytes.Repeat([]byte("w"), 20_000)
	s := &sink{}
	st, _ := exited(t, data, s, false)
	go func() {
		time.Sleep(drainMax + 500*time.Millisecond)
		st.pump(st.outs[0], FrameStdout)
	}()
	st.drain()
	if got := s.payload(t); len(got) != len(data) {
		t.Fatalf("the drain cut the output: %d bytes of %d", len(got), len(data))
	}
}

// Output waits for "started": a pump whose process wrote at once sends nothing before it.
func TestPumpSendsNothingBeforeStarted(t *testing.T) {
	s := &sink{}
	st, _ := exited(t, []byte("early\n"), s, false)
	st.started = make(chan struct{})
	go st.pump(st.outs[0], FrameStdout)
	time.Sleep(300 * time.Millisecond)
	if got := s.payload(t); len(got) != 0 {
		t.Fatalf("sent before started: %q", got)
	}
	st.startedSent()
	st.outputs.Wait()
	if got := string(s.payload(t)); got != "early\n" {
		t.Fatalf("sent after started: %q", got)
	}
}

// A node that is gone: the pump whose send failed returns with output left in its pipe, and
// the other pipe is held open by a child that escaped the process's group. Nobody reads what
// is left: the drain does not wait for it, and ends at its quiet bound.
func TestDrainEndsWhenThePumpsNodeIsGone(t *testing.T) {
	s := &sink{fail: true}
	st, _ := exited(t, bytes.Repeat([]byte("v"), 2*outputBuf), s, false)
	r2, w2, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w2.Close()
		_ = r2.Close()
	})
	st.outs = append(st.outs, r2)
	st.outputs.Add(1)
	go st.pump(st.outs[0], FrameStdout)
	go st.pump(r2, FrameStderr)
	done := make(chan struct{})
	go func() {
		st.drain()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(drainMax + 2*time.Second):
		t.Fatal("the drain waits for output nobody will read")
	}
}
