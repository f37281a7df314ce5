package main

// `boxd spawner`: the node's host commands (zfs, runc, CNI plugins, nft, mount) start from this
// small host-side helper instead of from the node's own process (core/spawner.ts). Go starts a
// child with clone(CLONE_VM|CLONE_VFORK): no copy of the parent's page tables, which a fork of a
// Node.js process makes at every command (on a paravirtualised guest, 6–7 ms of CPU a command
// more than here; docs/decisions.md "The spawner").
//
// Wire (stdin and stdout, one byte stream each way): every frame is a 4-byte big-endian length,
// then that many bytes.
//   request: a JSON header {id, argv, env: ["K=V"…], cwd?, timeoutMs?, noStdio?, inputLen?,
//            lock?}, then, when inputLen is given, a frame of exactly that many input bytes.
//            `lock` is a file held (flock LOCK_EX, across processes) from before the command
//            starts until it exits; the wait for it is bounded by timeoutMs too, apart from the
//            command's own run, and a command whose lock was not free in time is answered
//            {id, error: {code: ETIMEDOUT, syscall: flock}} without being started.
//   answer:  {ready: true} once, at start; then per request a JSON header
//            {id, exitCode (null when a signal ended it), stdoutLen, stderrLen}, then a frame
//            of stdout bytes and one of stderr bytes; or {id, error} alone (it did not start).
// It exits when its stdin ends (the node is gone); commands it started run on.

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// spawnMaxFrame bounds a request header or input (a command's input is small: a config file).
const spawnMaxFrame = 64 << 20

type spawnRequest struct {
	ID        int64    `json:"id"`
	Argv      []string `json:"argv"`
	Env       []string `json:"env"`
	Cwd       string   `json:"cwd,omitempty"`
	TimeoutMs int64    `json:"timeoutMs,omitempty"`
	NoStdio   bool     `json:"noStdio,omitempty"`
	InputLen  *int64   `json:"inputLen,omitempty"`
	// Op names work the helper does itself rather than a command: "nft-elements" (nftelem.go).
	Op  string              `json:"op,omitempty"`
	Nft *nftElementsRequest `json:"nft,omitempty"`
	Net *boxNetRequest      `json:"net,omitempty"`
	// The mount point of "remount-private", and the options of its mount to keep (as
	// /proc/self/mountinfo names them: ro, noexec, noatime…).
	Path string   `json:"path,omitempty"`
	Keep []string `json:"keep,omitempty"`
	// A lock file held while the command runs (core/command.ts RunOptions.lockFile).
	Lock string `json:"lock,omitempty"`
}

type spawnError struct {
	Message string `json:"message"`
	Code    string `json:"code,omitempty"`
	Errno   int    `json:"errno,omitempty"`
	Syscall string `json:"syscall,omitempty"`
	Path    string `json:"path,omitempty"`
}

type spawnAnswer struct {
	Ready     bool        `json:"ready,omitempty"`
	ID        int64       `json:"id,omitempty"`
	ExitCode  *int        `json:"exitCode"`
	StdoutLen int         `json:"stdoutLen"`
	StderrLen int         `json:"stderrLen"`
	Error     *spawnError `json:"error,omitempty"`
}

type spawnWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (s *spawnWriter) frame(b []byte) error {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := s.w.Write(n[:]); err != nil {
		return err
	}
	_, err := s.w.Write(b)
	return err
}

// send writes an answer and its output frames as one unit.
func (s *spawnWriter) send(a spawnAnswer, out, errOut []byte) {
	h, _ := json.Marshal(a)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.frame(h) != nil {
		return
	}
	if a.Error == nil && !a.Ready {
		if s.frame(out) != nil || s.frame(errOut) != nil {
			return
		}
	}
	_ = s.w.Flush()
}

func readFrame(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > spawnMaxFrame {
		return nil, fmt.Errorf("frame of %d bytes", size)
	}
	b := make([]byte, size)
	_, err := io.ReadFull(r, b)
	return b, err
}

func hostSpawner() int {
	// Signals to the node's process group (Ctrl-C, a service manager's stop) are for the node:
	// caught and dropped (caught, not ignored: the commands started here get their defaults).
	dropped := make(chan os.Signal, 8)
	signal.Notify(dropped, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	go func() {
		for range dropped {
		}
	}()
	in := bufio.NewReaderSize(os.Stdin, 64<<10)
	out := &spawnWriter{w: bufio.NewWriterSize(os.Stdout, 64<<10)}
	out.send(spawnAnswer{Ready: true}, nil, nil)
	for {
		h, err := readFrame(in)
		if err != nil {
			return 0 // the node is gone (or spoke nonsense): what was started runs on
		}
		var req spawnRequest
		if err := json.Unmarshal(h, &req); err != nil {
			fmt.Fprintf(os.Stderr, "boxd spawner: bad request: %v\n", err)
			return 2
		}
		var input []byte
		if req.InputLen != nil {
			if input, err = readFrame(in); err != nil {
				return 0
			}
		}
		go spawnOne(out, req, input)
	}
}

func spawnOne(out *spawnWriter, req spawnRequest, input []byte) {
	if req.Op != "" {
		helperOp(out, req)
		return
	}
	if len(req.Argv) == 0 {
		out.send(spawnAnswer{ID: req.ID, Error: &spawnError{Message: "no command", Code: "EINVAL"}}, nil, nil)
		return
	}
	bin, lookErr := lookPathIn(req.Argv[0], req.Env)
	if lookErr != nil {
		out.send(spawnAnswer{ID: req.ID, Error: spawnErrorOf(req, lookErr)}, nil, nil)
		return
	}
	// `boxd netns …` is this very program: run here, without a program start (≈15 ms of CPU a
	// create on the build machine). Its holder is still a process of its own (new namespaces).
	if len(req.Argv) > 1 && req.Argv[1] == "netns" && isSelf(bin) {
		var stderr limitedBuffer
		code := hostNetnsTo(req.Argv[2:], &stderr)
		out.send(spawnAnswer{ID: req.ID, ExitCode: &code, StderrLen: len(stderr.b)}, nil, stderr.b)
		return
	}
	// `boxd listen SOCKET PROGRAM…` likewise: the socket made here, PROGRAM (runc) started with
	// it as fd 3, instead of a `boxd listen` process that makes it and execs PROGRAM.
	var extra []*os.File
	if len(req.Argv) > 3 && req.Argv[1] == "listen" && isSelf(bin) {
		sock, err := listeningSocket(req.Argv[2])
		if err != nil {
			out.send(spawnAnswer{ID: req.ID, Error: &spawnError{Message: "boxd listen: " + err.Error(), Syscall: "listen"}}, nil, nil)
			return
		}
		defer sock.Close()
		extra = []*os.File{sock}
		req.Argv = req.Argv[3:]
		if bin, lookErr = lookPathIn(req.Argv[0], req.Env); lookErr != nil {
			out.send(spawnAnswer{ID: req.ID, Error: spawnErrorOf(req, lookErr)}, nil, nil)
			return
		}
	}
	unlock := func() {}
	if req.Lock != "" {
		let, err := lockFile(req.Lock, req.TimeoutMs)
		if err == errLockTimeout {
			// Not started: an error answer (the node tells it from a command killed at its
			// deadline, which would count as a hung storage daemon).
			out.send(spawnAnswer{ID: req.ID, Error: &spawnError{Message: fmt.Sprintf("%s was not started: the lock %s was not free within %d ms", req.Argv[0], req.Lock, req.TimeoutMs), Code: "ETIMEDOUT", Syscall: "flock", Path: req.Lock}}, nil, nil)
			return
		}
		if err != nil {
			out.send(spawnAnswer{ID: req.ID, Error: &spawnError{Message: "lock " + req.Lock + ": " + err.Error(), Syscall: "flock", Path: req.Lock}}, nil, nil)
			return
		}
		var once sync.Once
		unlock = func() { once.Do(let) }
		// The wait had its own bound: the command gets its whole time below (one killed at a
		// deadline the wait had used up would read as a hung storage daemon).
		defer unlock()
	}
	cmd := &exec.Cmd{Path: bin, Args: req.Argv, Env: req.Env, Dir: req.Cwd, ExtraFiles: extra}
	var stdout, stderr limitedBuffer
	if !req.NoStdio {
		cmd.Stdout = &stdout
		cmd.Stderr = &stderr
		if input != nil {
			cmd.Stdin = &byteReader{b: input}
		}
	}
	if err := cmd.Start(); err != nil {
		out.send(spawnAnswer{ID: req.ID, Error: spawnErrorOf(req, err)}, nil, nil)
		return
	}
	var timer *time.Timer
	if req.TimeoutMs > 0 {
		timer = time.AfterFunc(time.Duration(req.TimeoutMs)*time.Millisecond, func() { _ = cmd.Process.Kill() })
	}
	// With pipes, Wait returns once they closed (all the output read); without stdio, at exit:
	// what the command started may live on (`runc run --detach`).
	_ = cmd.Wait()
	// Let go at the exit, not once the answer is written (the node may be slow to read it).
	unlock()
	if timer != nil {
		timer.Stop()
	}
	var code *int
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Exited() {
		c := ws.ExitStatus()
		code = &c
	}
	out.send(spawnAnswer{ID: req.ID, ExitCode: code, StdoutLen: len(stdout.b), StderrLen: len(stderr.b)}, stdout.b, stderr.b)
}

// helperOp answers an op as a command that exited 0 (its result, if any, as stdout), or with
// the error that stopped it.
func helperOp(out *spawnWriter, req spawnRequest) {
	var err error
	var result []byte
	switch {
	case req.Op == "nft-elements" && req.Nft != nil:
		err = nftElements(*req.Nft)
	case req.Op == "box-net" && req.Net != nil:
		result, err = boxNet(*req.Net)
	case req.Op == "remount-private" && req.Path != "":
		err = remountPrivate(req.Path, req.Keep)
	case req.Op == "make-private" && req.Path != "":
		var state string
		state, err = makePrivate(req.Path)
		result = []byte(state)
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	if err != nil {
		e := &spawnError{Message: err.Error(), Syscall: req.Op}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			e.Code = errnoName(errno)
			e.Errno = -int(errno)
		}
		out.send(spawnAnswer{ID: req.ID, Error: e}, nil, nil)
		return
	}
	zero := 0
	out.send(spawnAnswer{ID: req.ID, ExitCode: &zero, StdoutLen: len(result)}, result, nil)
}

var selfInfo, selfErr = func() (os.FileInfo, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return os.Stat(exe)
}()

// isSelf tells whether bin is this program's own file.
func isSelf(bin string) bool {
	if selfErr != nil {
		return false
	}
	st, err := os.Stat(bin)
	return err == nil && os.SameFile(st, selfInfo)
}

// listeningSocket is `boxd listen`'s socket: a unix stream socket listening at path (what was
// there replaced), reachable by root only.
func listeningSocket(path string) (*os.File, error) {
	_ = os.Remove(path)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	// The file bind makes takes the socket's mode (less the umask, which a process with threads
	// must not change): 0600 from the start.
	if err := syscall.Fchmod(fd, 0o600); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("fchmod", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Listen(fd, 128); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("listen", err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// remountPrivate makes a mount point nosuid,nodev (a bind remount), as `mount -o
// remount,bind,nosuid,nodev` does. A bind remount sets the mount's flags to exactly those given:
// the node names the ones the mount has (`keep`, read from /proc/self/mountinfo), so nothing here
// asks the filesystem (a statfs of a FUSE mount is a request to its daemon, which may be hung).
func remountPrivate(path string, keep []string) error {
	flags := uintptr(syscall.MS_REMOUNT | syscall.MS_BIND | syscall.MS_NOSUID | syscall.MS_NODEV)
	byName := map[string]uintptr{
		"ro": syscall.MS_RDONLY, "noexec": syscall.MS_NOEXEC, "noatime": syscall.MS_NOATIME,
		"nodiratime": syscall.MS_NODIRATIME, "relatime": syscall.MS_RELATIME,
		"nosymfollow": 0x100, // MS_NOSYMFOLLOW
	}
	for _, name := range keep {
		flags |= byName[name]
	}
	// mountinfo shows strict atime as neither noatime nor relatime; a remount without an atime
	// flag would be relatime (and refused where the atime mode is locked, in a user namespace).
	if flags&(syscall.MS_NOATIME|syscall.MS_RELATIME) == 0 {
		flags |= syscall.MS_STRICTATIME
	}
	if err := syscall.Mount("", path, "", flags, ""); err != nil {
		return &os.PathError{Op: "remount", Path: path, Err: err}
	}
	return nil
}

// makePrivate makes the mount at path nosuid,nodev unless it is already: its options are read
// from this process's /proc/self/mountinfo (the node's mount namespace), so the node does no
// read of the mount table of its own (the kernel writes it out whole, ~3 lines per box) and the
// check and the remount are one request. It answers "none" (no mount at path), "private" (it was
// already) or "remounted".
func makePrivate(path string) (string, error) {
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	opts := mountOptionsAt(info, path)
	if opts == nil {
		return "none", nil
	}
	if opts["nosuid"] && opts["nodev"] {
		return "private", nil
	}
	keep := []string{}
	for name := range opts {
		keep = append(keep, name)
	}
	if err := remountPrivate(path, keep); err != nil {
		return "", err
	}
	return "remounted", nil
}

// mountOptionsAt gives the per-mount options of the last mount whose mount point is exactly
// path (the one in effect), or nil if none is.
func mountOptionsAt(info []byte, path string) map[string]bool {
	var found map[string]bool
	for _, line := range strings.Split(string(info), "\n") {
		// Fields are separated by single spaces (the kernel escapes those in a field); not
		// strings.Fields, which also splits at U+0085 and U+00A0.
		f := strings.Split(line, " ")
		if len(f) < 6 || unescapeMountinfo(f[4]) != path {
			continue
		}
		found = map[string]bool{}
		for _, o := range strings.Split(f[5], ",") {
			found[o] = true
		}
	}
	return found
}

// unescapeMountinfo undoes the kernel's octal escapes of a mountinfo field (\040 for a space,
// \011, \012, \134).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// limitedBuffer collects a command's output (bounded by the frame size the node reads).
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > spawnMaxFrame*4 {
		return 0, errors.New("output too large")
	}
	l.b = append(l.b, p...)
	return len(p), nil
}

type byteReader struct {
	b []byte
	i int
}

func (r *byteReader) Read(p []byte) (int, error) {
	if r.i >= len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.i:])
	r.i += n
	return n, nil
}

// lookPathIn resolves a command name on the PATH of the env it will run with (as Node.js's
// spawn does), not the helper's own.
func lookPathIn(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	pathVar := ""
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			pathVar = kv[5:]
		}
	}
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &os.PathError{Op: "spawn", Path: name, Err: syscall.ENOENT}
}

// spawnErrorOf answers what Node.js's spawn error would hold: code, errno, syscall, path.
func spawnErrorOf(req spawnRequest, err error) *spawnError {
	e := &spawnError{Message: err.Error(), Syscall: "spawn " + req.Argv[0], Path: req.Argv[0]}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		e.Code = errnoName(errno)
		e.Errno = -int(errno)
		e.Message = fmt.Sprintf("spawn %s %s", req.Argv[0], e.Code)
	}
	return e
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.ENOENT:
		return "ENOENT"
	case syscall.EACCES:
		return "EACCES"
	case syscall.ENOTDIR:
		return "ENOTDIR"
	case syscall.ENOEXEC:
		return "ENOEXEC"
	case syscall.E2BIG:
		return "E2BIG"
	case syscall.ENOMEM:
		return "ENOMEM"
	case syscall.EAGAIN:
		return "EAGAIN"
	case syscall.EPERM:
		return "EPERM"
	case syscall.EEXIST:
		return "EEXIST"
	case syscall.EINVAL:
		return "EINVAL"
	case syscall.EOPNOTSUPP:
		return "EOPNOTSUPP"
	}
	return fmt.Sprintf("E%d", int(e))
}

var errLockTimeout = errors.New("timed out")

// lockFile takes an exclusive flock(2) on path, waiting at most timeoutMs (0: for ever), and
// answers what lets it go. The descriptor is close-on-exec: commands never inherit the lock, and
// it goes with this process should it end. A wait that outlives its deadline is left to finish
// in the background (a goroutine and a descriptor until the holder lets go: at most one per
// command the node gave up on) and lets go at once.
func lockFile(path string, timeoutMs int64) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	got := make(chan error, 1)
	go func() {
		for {
			err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if err != syscall.EINTR {
				got <- err
				return
			}
		}
	}()
	var deadline <-chan time.Time
	if timeoutMs > 0 {
		t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
		defer t.Stop()
		deadline = t.C
	}
	select {
	case err := <-got:
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		return func() { _ = f.Close() }, nil
	case <-deadline:
		go func() {
			<-got
			_ = f.Close()
		}()
		return nil, errLockTimeout
	}
}
