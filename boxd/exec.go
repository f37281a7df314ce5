package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	maxArgs   = 1 << 16
	maxArgLen = MaxFrame
	outputBuf = 32 << 10
	maxID     = 1<<32 - 2
)

func validate(req *ExecRequest) *Failure {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return failf("input", "command", "command must not be empty")
	}
	if len(req.Argv) > maxArgs {
		return failf("input", "command", "too many arguments")
	}
	for _, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return failf("input", "command", "command arguments must not contain NUL")
		}
	}
	for _, e := range req.Env {
		if strings.IndexByte(e, 0) >= 0 || strings.IndexByte(e, '=') <= 0 {
			return failf("input", "env", "environment entries are NAME=value without NUL")
		}
	}
	if !strings.HasPrefix(req.Cwd, "/") || strings.IndexByte(req.Cwd, 0) >= 0 {
		return failf("input", "cwd", "cwd must be an absolute path")
	}
	if req.UID > maxID || req.GID > maxID {
		return failf("input", "user", "user ids out of range")
	}
	if req.TTY && (req.Cols == 0 || req.Rows == 0) {
		req.Cols, req.Rows = 80, 24
	}
	if req.TimeoutMs < 0 {
		return failf("input", "timeout", "timeout must be positive")
	}
	return nil
}

func envValue(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if strings.HasPrefix(env[i], key+"=") {
			return env[i][len(key)+1:], true
		}
	}
	return "", false
}

// lookPath finds the command as a shell would: a name with a slash as it is (relative to the
// working directory), else the first regular executable file of that name in PATH.
func lookPath(name, cwd string, env []string) string {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			return filepath.Join(cwd, name)
		}
		return name
	}
	p, ok := envValue(env, "PATH")
	if !ok {
		p = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for _, dir := range strings.Split(p, ":") {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		full := filepath.Join(dir, name)
		if st, err := os.Stat(full); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return full
		}
	}
	return ""
}

// homeOf is the home directory of uid in the box's /etc/passwd ("/" when it has none).
func homeOf(uid uint32) string {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return "/"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Split(sc.Text(), ":")
		if len(parts) >= 6 {
			if id, err := strconv.ParseUint(parts[2], 10, 32); err == nil && uint32(id) == uid && parts[5] != "" {
				return parts[5]
			}
		}
	}
	return "/"
}

// canEnter says whether uid (with gids) may search every directory down to dir, by mode bits:
// what the kernel refused a chdir for, told apart from an exec that failed.
func canEnter(dir string, uid uint32, gids []uint32) bool {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false
	}
	if st, err := os.Stat(real); err != nil || !st.IsDir() {
		return false
	}
	if uid == 0 {
		return true
	}
	p := "/"
	for _, part := range append([]string{""}, strings.Split(strings.Trim(real, "/"), "/")...) {
		p = filepath.Join(p, part)
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			return false
		}
		mode := st.Mode
		ok := false
		if st.Uid == uid {
			ok = mode&0o100 != 0
		} else if inGroups(st.Gid, gids) {
			ok = mode&0o010 != 0
		} else {
			ok = mode&0o001 != 0
		}
		if !ok {
			return false
		}
	}
	return true
}

func inGroups(g uint32, gids []uint32) bool {
	for _, x := range gids {
		if x == g {
			return true
		}
	}
	return false
}

type execState struct {
	c       net.Conn
	w       *Writer
	req     *ExecRequest
	pid     int
	stdin   *os.File // our end of the process's stdin (pipe or pty master), or nil
	ptm     *os.File
	outputs sync.WaitGroup
	outs    []*os.File // what the pumps read
	sends   sendClock  // time the pumps wait for the node to take a frame (drain.go)
	// Closed once "started" is sent (or will never be): no output frame goes before it. The
	// node stops reading a connection whose output is not taken, and takes none before it
	// knows the pid: a pump that wrote first could fill the socket and hold the writer's lock
	// that "started" waits on (seen: a flood of output answered 503 "boxd did not start the
	// process within 10 s" on a loaded host).
	started     chan struct{}
	startedOnce sync.Once
	read        int64 // bytes the pumps have read (atomic)
	endedMu     sync.Mutex
	ended       map[*os.File]bool // pumps that have returned, by what they read
	drainTicks  <-chan time.Time  // tests: the drain's ticks (nil: every drainTick)
}

func (st *execState) startedSent() {
	st.startedOnce.Do(func() {
		if st.started != nil {
			close(st.started)
		}
	})
}

func (st *execState) closeOutputs() {
	for _, f := range st.outs {
		_ = f.Close()
	}
}

func (s *Server) exec(c net.Conn, w *Writer, req *ExecRequest) {
	if req.User != "" {
		acct, f := lookupUser(req.User)
		if f != nil {
			_ = w.JSON(FrameError, f)
			return
		}
		req.UID, req.GID, req.Groups = acct.UID, acct.GID, acct.Groups
	}
	if f := validate(req); f != nil {
		_ = w.JSON(FrameError, f)
		return
	}
	cwd := filepath.Clean(req.Cwd)
	env := append([]string(nil), req.Env...)
	if _, ok := envValue(env, "HOME"); !ok {
		env = append(env, "HOME="+homeOf(req.UID))
	}
	if req.TTY {
		if _, ok := envValue(env, "TERM"); !ok {
			env = append(env, "TERM=xterm")
		}
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		_ = w.JSON(FrameError, cwdFailure(req))
		return
	}
	gids := append([]uint32{req.GID}, req.Groups...)
	path := lookPath(req.Argv[0], cwd, env)
	if path == "" {
		if !canEnter(cwd, req.UID, gids) {
			_ = w.JSON(FrameError, cwdFailure(req))
			return
		}
		if req.Detach {
			_ = w.JSON(FrameError, failf("input", "command", "could not start the detached process: %s: command not found", req.Argv[0]))
			return
		}
		_ = w.JSON(FrameStarted, Started{Pid: 0})
		_ = w.Write(FrameStderr, []byte(fmt.Sprintf("boxd: %s: command not found\n", req.Argv[0])))
		_ = w.JSON(FrameExit, Exit{Code: 127})
		return
	}

	st := &execState{c: c, w: w, req: req, started: make(chan struct{})}
	defer st.startedSent() // on every way out: no pump waits for ever
	var files []*os.File   // the child's stdio
	var parentEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			if f != nil {
				_ = f.Close()
			}
		}
	}
	attr := &syscall.SysProcAttr{
		Setsid:     true,
		Credential: &syscall.Credential{Uid: req.UID, Gid: req.GID, Groups: req.Groups},
	}
	switch {
	case req.Detach:
		null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		if err != nil {
			_ = w.JSON(FrameError, failf("internal", "", "open /dev/null: %v", err))
			return
		}
		files = []*os.File{null, null, null}
	case req.TTY:
		ptm, pts, err := openPty(req.Cols, req.Rows, req.Echo, int(req.UID), int(req.GID))
		if err != nil {
			_ = w.JSON(FrameError, failf("internal", "", "cannot make a terminal: %v", err))
			return
		}
		files = []*os.File{pts, pts, pts}
		st.ptm, st.stdin = ptm, ptm
		parentEnds = append(parentEnds, ptm)
		attr.Setctty = true
		attr.Ctty = 0
	default:
		outR, outW, err1 := os.Pipe()
		errR, errW, err2 := os.Pipe()
		if err1 != nil || err2 != nil {
			closeAll([]*os.File{outR, outW, errR, errW})
			_ = w.JSON(FrameError, failf("internal", "", "pipes: %v %v", err1, err2))
			return
		}
		var in *os.File
		if req.Stdin {
			inR, inW, err := os.Pipe()
			if err != nil {
				closeAll([]*os.File{outR, outW, errR, errW})
				_ = w.JSON(FrameError, failf("internal", "", "pipe: %v", err))
				return
			}
			in = inR
			st.stdin = inW
			parentEnds = append(parentEnds, inW)
		} else {
			in, _ = os.OpenFile(os.DevNull, os.O_RDONLY, 0)
		}
		// The process may reopen its stdio (`> /dev/stderr` is /proc/self/fd/2): a pipe only
		// lets its owner, so the pipes are the user's.
		owned := []*os.File{outW, errW}
		if req.Stdin {
			owned = append(owned, in)
		}
		for _, f := range owned {
			_ = f.Chown(int(req.UID), int(req.GID))
		}
		files = []*os.File{in, outW, errW}
		parentEnds = append(parentEnds, outR, errR)
		st.outs = []*os.File{outR, errR}
		st.outputs.Add(2)
		go st.pump(outR, FrameStdout)
		go st.pump(errR, FrameStderr)
	}

	pid, status, err := s.reaper.Start(func() (int, error) {
		p, err := os.StartProcess(path, req.Argv, &os.ProcAttr{Dir: cwd, Env: env, Files: files, Sys: attr})
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		_ = p.Release()
		return pid, nil
	})
	closeAll(uniq(files))
	if err != nil {
		closeAll(parentEnds)
		st.startedSent()
		st.outputs.Wait()
		if !canEnter(cwd, req.UID, gids) {
			_ = w.JSON(FrameError, cwdFailure(req))
			return
		}
		code := 126
		var errno syscall.Errno
		if errors.As(err, &errno) && errno == syscall.ENOENT {
			code = 127
		}
		if req.Detach {
			_ = w.JSON(FrameError, failf("input", "command", "could not start the detached process: %s: %v", req.Argv[0], errnoOf(err)))
			return
		}
		_ = w.JSON(FrameStarted, Started{Pid: 0})
		_ = w.Write(FrameStderr, []byte(fmt.Sprintf("boxd: %s: %v\n", req.Argv[0], errnoOf(err))))
		_ = w.JSON(FrameExit, Exit{Code: code})
		return
	}
	st.pid = pid
	err = w.JSON(FrameStarted, Started{Pid: pid})
	st.startedSent()
	if err != nil {
		if !req.Detach {
			killGroup(pid, syscall.SIGKILL)
		}
		closeAll(parentEnds)
		return
	}
	if req.Detach {
		return // the reaper collects it when it ends
	}
	if req.TTY {
		st.outs = []*os.File{st.ptm}
		st.outputs.Add(1)
		go st.pump(st.ptm, FrameStdout)
	}
	gone := st.run(status)
	closeAll(parentEnds)
	// The node may still be writing (stdin the process never read): end our side only, and let
	// the node close, so that its writes do not fail before it has read the exit.
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	select {
	case <-gone:
	case <-time.After(lingerMax):
	}
}

// lingerMax bounds how long boxd waits, its answer sent, for the node to close.
const lingerMax = 2 * time.Second

// linger ends boxd's side of a connection whose answer is sent and reads what the node still
// sends until it closes (or lingerMax): closing with unread bytes would reset the connection,
// and the node could lose the answer to its own failed write.
func linger(c net.Conn) {
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(lingerMax))
	_, _ = io.Copy(io.Discard, c)
}

func cwdFailure(req *ExecRequest) *Failure {
	return failf("cwd", "cwd", "working directory %s does not exist in the box or cannot be entered", req.Cwd)
}

func errnoOf(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

func uniq(fs []*os.File) []*os.File {
	var out []*os.File
	seen := map[*os.File]bool{}
	for _, f := range fs {
		if f != nil && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}

func killGroup(pid int, sig syscall.Signal) {
	_ = syscall.Kill(-pid, sig)
	_ = syscall.Kill(pid, sig)
}

// pump sends what the process writes, frame by frame; a slow node slows the process down.
func (st *execState) pump(r *os.File, t byte) {
	defer st.outputs.Done()
	defer st.pumpEnded(r) // what it leaves in its pipe is read by no one (drain.go)
	buf := make([]byte, outputBuf)
	dropping := false
	for {
		n, err := r.Read(buf)
		if n > 0 {
			atomic.AddInt64(&st.read, int64(n))
		}
		if n > 0 && st.started != nil {
			<-st.started // output goes after "started" (a closed channel: at once)
		}
		if n > 0 {
			// Time spent waiting for the node to take the output is not quiet, and the drain
			// after exit counts it toward its bound only past what the process left (drain.go).
			// Once the node has let go of a no_hup process its output is dropped, but its pipe
			// is still emptied (a full pipe would stop the process), and that is output too.
			st.sends.begin()
			if !dropping && st.w.Write(t, buf[:n]) != nil {
				if !st.req.NoHup {
					st.sends.end()
					return
				}
				dropping = true
			}
			st.sends.end()
		}
		if err != nil {
			return
		}
	}
}

// run serves the node's frames until the process ends, then drains and sends the exit.
// It answers a channel closed when the node has closed its side.
func (st *execState) run(status <-chan syscall.WaitStatus) <-chan struct{} {
	req := st.req
	var timedOut bool
	var timeout <-chan time.Time
	if req.TimeoutMs > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMs) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	gone := make(chan struct{}) // the node went away
	nodeGone := gone
	// stdin is written by a goroutine of its own, each write acknowledged: the node keeps at most
	// StdinWindow bytes unacknowledged, so this reader never waits for the process to read.
	q := &stdinQueue{}
	q.cond = sync.NewCond(&q.mu)
	go func() {
		for {
			b, eof, ok := q.pop()
			if !ok {
				return
			}
			if eof {
				if !req.TTY && st.stdin != nil {
					_ = st.stdin.Close()
				}
				continue
			}
			if st.stdin != nil {
				_, _ = st.stdin.Write(b)
			}
			_ = st.w.JSON(FrameStdinAck, map[string]int{"n": len(b)})
		}
	}()
	exited := make(chan struct{})
	go func() {
		defer close(gone)
		defer q.close()
		for {
			f, err := ReadFrame(st.c)
			if err != nil {
				return
			}
			switch f.Type {
			case FrameStdin:
				if !q.push(f.Payload, false) {
					killGroup(st.pid, syscall.SIGKILL)
					return // past the window: the node broke the protocol
				}
			case FrameStdinEOF:
				q.push(nil, true)
			case FrameResize:
				var r Resize
				if json.Unmarshal(f.Payload, &r) == nil && st.ptm != nil && r.Cols > 0 && r.Rows > 0 {
					_ = setWinsize(st.ptm, r.Cols, r.Rows)
				}
			case FrameSignal:
				var sr SignalReq
				if json.Unmarshal(f.Payload, &sr) == nil && sr.Signal > 0 && sr.Signal < 65 {
					if sr.Group {
						killGroup(st.pid, syscall.Signal(sr.Signal))
					} else {
						_ = syscall.Kill(st.pid, syscall.Signal(sr.Signal))
					}
				}
			default:
				return // a frame that has no place here: the node is confused; end it
			}
		}
	}()
	var ws syscall.WaitStatus
	for waiting := true; waiting; {
		select {
		case ws = <-status:
			waiting = false
		case <-timeout:
			timedOut = true
			timeout = nil
			killGroup(st.pid, syscall.SIGKILL)
		case <-gone:
			gone = nil
			if !req.NoHup {
				killGroup(st.pid, syscall.SIGKILL)
			} else {
				// Left running: the connection is let go of (output writes fail at once, and are
				// dropped), stdin ends; a terminal stays open (closing it would hang it up).
				_ = st.c.Close()
				if !req.TTY && st.stdin != nil {
					_ = st.stdin.Close()
				}
			}
		}
	}
	close(exited)
	if timedOut {
		killGroup(st.pid, syscall.SIGKILL) // what the process left in its group
	}
	st.drain()
	exit := Exit{}
	switch {
	case ws.Exited():
		exit.Code = ws.ExitStatus()
	case ws.Signaled():
		exit.Signal = int(ws.Signal())
		exit.Code = 128 + exit.Signal
	}
	if timedOut {
		exit.TimedOut = true
		exit.Code = 124
	}
	_ = st.w.JSON(FrameExit, exit)
	return nodeGone
}

// stdinQueue holds what the node sent for stdin until the writer has written it; bounded by the
// window the node must respect.
type stdinQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	items  [][]byte
	eofs   []bool
	bytes  int
	closed bool
}

func (q *stdinQueue) push(b []byte, eof bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.bytes+len(b) > StdinWindow+MaxFrame {
		return false
	}
	q.items = append(q.items, b)
	q.eofs = append(q.eofs, eof)
	q.bytes += len(b)
	q.cond.Signal()
	return true
}

func (q *stdinQueue) pop() ([]byte, bool, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.items) == 0 {
		return nil, false, false
	}
	b, eof := q.items[0], q.eofs[0]
	q.items, q.eofs = q.items[1:], q.eofs[1:]
	q.bytes -= len(b)
	return b, eof, true
}

func (q *stdinQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.items, q.eofs = nil, nil
	q.cond.Broadcast()
	q.mu.Unlock()
}
