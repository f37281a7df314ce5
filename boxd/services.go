package main

// Service supervision: long-lived processes boxd starts, restarts by policy with backoff, stops
// with a signal and a grace, and logs with rotation. Specs persist in the box at
// /etc/boxes/services/<name>.json, so services come back when the box starts again; they are
// read from there on every list and get, so a damaged file shows as a tombstone at once.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

var servicesDir = "/etc/boxes/services"

// maxSpecFile bounds a spec file: a service's answer carries it in one frame.
const maxSpecFile = 64 << 10

var serviceNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ServiceSpec is what boxd needs of a spec file; the file may hold more (the node's own fields:
// port, publish, ready, tags, secret_env), kept as they are.
type ServiceSpec struct {
	Name    string            `json:"name"`
	Command []string          `json:"command"`
	Cwd     string            `json:"cwd,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	User    string            `json:"user,omitempty"`
	Restart string            `json:"restart,omitempty"`
	Stop    *StopSpec         `json:"stop,omitempty"`
	// Disabled: stopped on request; not started when the box starts.
	Disabled bool `json:"disabled,omitempty"`
}

type StopSpec struct {
	Signal    string `json:"signal,omitempty"`
	GraceSecs *int   `json:"grace_secs,omitempty"`
}

// ServiceState is a service as the node sees it.
type ServiceState struct {
	Name         string          `json:"name"`
	State        string          `json:"state"` // starting running restarting stopped exited failed corrupt
	Pid          int             `json:"pid,omitempty"`
	Restarts     int             `json:"restarts"`
	LastExitCode *int            `json:"last_exit_code,omitempty"`
	Error        string          `json:"error,omitempty"`
	Spec         json.RawMessage `json:"spec,omitempty"`
}

var signalNames = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "TERM": syscall.SIGTERM, "ALRM": syscall.SIGALRM,
	"WINCH": syscall.SIGWINCH, "STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT, "PWR": syscall.SIGPWR,
}

func parseSignal(s string) (syscall.Signal, bool) {
	if s == "" {
		return syscall.SIGTERM, true
	}
	sig, ok := signalNames[strings.TrimPrefix(strings.ToUpper(s), "SIG")]
	return sig, ok
}

// check validates a spec as far as it can be without starting it.
func (sp *ServiceSpec) check() *Failure {
	if !serviceNameRE.MatchString(sp.Name) || strings.Contains(sp.Name, "--") {
		return failf("input", "name", "invalid service name %q", sp.Name)
	}
	if len(sp.Command) == 0 || sp.Command[0] == "" {
		return failf("input", "command", "command must not be empty")
	}
	for _, a := range sp.Command {
		if strings.IndexByte(a, 0) >= 0 {
			return failf("input", "command", "command arguments must not contain NUL")
		}
	}
	if sp.Cwd != "" && (!strings.HasPrefix(sp.Cwd, "/") || strings.IndexByte(sp.Cwd, 0) >= 0) {
		return failf("input", "cwd", "cwd must be an absolute path")
	}
	for k, v := range sp.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return failf("input", "env", "environment entries are NAME=value: a name non-empty without '=' or NUL, a value without NUL")
		}
	}
	switch sp.Restart {
	case "", "always", "on-failure", "never":
	default:
		return failf("input", "restart", "restart must be always, on-failure or never")
	}
	if sp.Stop != nil {
		if _, ok := parseSignal(sp.Stop.Signal); !ok {
			return failf("input", "stop.signal", "unknown signal %q", sp.Stop.Signal)
		}
		if sp.Stop.GraceSecs != nil && (*sp.Stop.GraceSecs < 0 || *sp.Stop.GraceSecs > 3600) {
			return failf("input", "stop.grace_secs", "grace_secs must be 0…3600")
		}
	}
	return nil
}

func (sp *ServiceSpec) stopSignal() syscall.Signal {
	if sp.Stop == nil {
		return syscall.SIGTERM
	}
	sig, _ := parseSignal(sp.Stop.Signal)
	return sig
}

func (sp *ServiceSpec) grace() time.Duration {
	if sp.Stop == nil || sp.Stop.GraceSecs == nil {
		return 10 * time.Second
	}
	return time.Duration(*sp.Stop.GraceSecs) * time.Second
}

// service is one supervised service.
type service struct {
	name     string
	spec     *ServiceSpec
	raw      map[string]json.RawMessage
	state    string
	pid      int
	restarts int
	lastExit *int
	gen      int           // bumped by stop and start: a stale run loop ends
	done     chan struct{} // closed when the run loop of gen ends
	cancel   chan struct{} // closed by a stop: a backoff wait ends at once
	log      *rotatingLog
}

// Supervisor holds the box's services.
type Supervisor struct {
	ops      sync.Mutex // one start, stop, restart or delete at a time
	mu       sync.Mutex
	reaper   *Reaper
	services map[string]*service
	halted   bool
}

func NewSupervisor(r *Reaper) *Supervisor {
	return &Supervisor{reaper: r, services: map[string]*service{}}
}

func specPath(name string) string { return filepath.Join(servicesDir, name+".json") }

// loadSpec reads one spec file: its fields for boxd, and all of it as it is.
func loadSpec(path string) (*ServiceSpec, map[string]json.RawMessage, error) {
	// Not blocking, not following: a FIFO or a link named like a spec is refused, not waited on.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, nil, fmt.Errorf("a symbolic link, not a file")
		}
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("not a regular file")
	}
	if st.Size() > maxSpecFile {
		return nil, nil, fmt.Errorf("larger than %d bytes", maxSpecFile)
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && st.Size() > 0 {
		return nil, nil, err
	}
	return parseSpec(b, strings.TrimSuffix(filepath.Base(path), ".json"))
}

// parseSpec reads a spec: its fields for boxd, and all of it as it is. `want` is the name it must
// have.
func parseSpec(b []byte, want string) (*ServiceSpec, map[string]json.RawMessage, error) {
	if len(b) > maxSpecFile {
		return nil, nil, fmt.Errorf("larger than %d bytes", maxSpecFile)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, nil, fmt.Errorf("not a JSON object: %v", err)
	}
	var sp ServiceSpec
	if err := json.Unmarshal(b, &sp); err != nil {
		return nil, nil, fmt.Errorf("bad field: %v", err)
	}
	if sp.Name != want {
		return nil, nil, fmt.Errorf("name %q does not match the file name", sp.Name)
	}
	if fl := sp.check(); fl != nil {
		return nil, nil, fl
	}
	return &sp, raw, nil
}

// saveSpec writes the spec file (0600: its env may hold secrets) through a temporary file.
func saveSpec(raw map[string]json.RawMessage, name string) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(raw); err != nil {
		return err
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if err := os.MkdirAll(servicesDir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(servicesDir, "."+name+".json."+randomSuffix())
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, specPath(name)); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

func setDisabled(raw map[string]json.RawMessage, disabled bool) {
	if disabled {
		raw["disabled"] = json.RawMessage("true")
	} else {
		delete(raw, "disabled")
	}
}

// Boot starts every service whose spec loads and is not disabled (at box start), one at a time
// with the node's calls. A spec whose user, cwd or command cannot be found is listed as failed,
// the reason in its log.
func (s *Supervisor) Boot() {
	entries, err := os.ReadDir(servicesDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".json")
		if name == e.Name() || !validServiceName(name) {
			continue
		}
		s.bootOne(name)
	}
}

func (s *Supervisor) bootOne(name string) {
	s.ops.Lock()
	defer s.ops.Unlock()
	sp, raw, err := loadSpec(specPath(name))
	if err != nil || sp.Disabled {
		return // listed as corrupt, or stopped
	}
	acct, cwd, path, env, fl := prepareService(sp)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halted {
		return
	}
	svc := s.service(name)
	if svc.done != nil {
		return // started by a call meanwhile
	}
	svc.spec, svc.raw = sp, raw
	if fl != nil {
		svc.state = "failed"
		_, _ = svc.log.Write([]byte("boxd: the service could not start with the box: " + fl.Message + "\n"))
		return
	}
	s.launch(svc, acct, cwd, path, env)
}

// service answers the entry for name, made if new (s.mu held).
func (s *Supervisor) service(name string) *service {
	svc := s.services[name]
	if svc == nil {
		svc = &service{name: name, state: "stopped", log: newRotatingLog(name)}
		s.services[name] = svc
	}
	return svc
}

// prepareService resolves what a start needs, inside the box: the user, the working
// directory (entered by that user), the command in PATH, the environment (the box's
// /etc/boxes-env, then the spec's, which wins).
func prepareService(sp *ServiceSpec) (*Account, string, string, []string, *Failure) {
	acct, fl := lookupUser(sp.User)
	if fl != nil {
		return nil, "", "", nil, fl
	}
	cwd := sp.Cwd
	if cwd == "" {
		cwd = acct.Home
		if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
			cwd = "/"
		}
	}
	cwd = filepath.Clean(cwd)
	if !canEnter(cwd, acct.UID, append([]uint32{acct.GID}, acct.Groups...)) {
		return nil, "", "", nil, failf("cwd", "cwd", "working directory %s does not exist in the box or cannot be entered", cwd)
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + acct.Home}
	env = append(env, boxEnv()...)
	keys := make([]string, 0, len(sp.Env))
	for k := range sp.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+sp.Env[k])
	}
	env = dedupEnv(env)
	path := lookPath(sp.Command[0], cwd, env)
	if path == "" {
		return nil, "", "", nil, failf("input", "command", "%s: command not found in the box", sp.Command[0])
	}
	return acct, cwd, path, env, nil
}

// dedupEnv keeps the last value of every name, in first-seen order.
func dedupEnv(env []string) []string {
	last := map[string]int{}
	for i, e := range env {
		k, _, _ := strings.Cut(e, "=")
		last[k] = i
	}
	out := env[:0:0]
	for i, e := range env {
		k, _, _ := strings.Cut(e, "=")
		if last[k] == i {
			out = append(out, e)
		}
	}
	return out
}

// launch begins a new run loop for svc (s.mu held; svc's old loop, if any, has ended).
func (s *Supervisor) launch(svc *service, acct *Account, cwd, path string, env []string) {
	svc.gen++
	svc.state = "starting"
	svc.pid = 0
	done := make(chan struct{})
	svc.done = done
	svc.cancel = make(chan struct{})
	go s.run(svc, svc.gen, done, svc.cancel, acct, cwd, path, env)
}

// backoff is the delay before the n-th quick restart in a row: 250 ms doubling to 30 s.
func backoff(n int) time.Duration {
	d := 250 * time.Millisecond
	for i := 0; i < n && d < 30*time.Second; i++ {
		d *= 2
	}
	if d > 30*time.Second {
		d = 30 * time.Second
	}
	return d
}

// stableRun: a process that ran this long resets the backoff.
const stableRun = 10 * time.Second

func (s *Supervisor) run(svc *service, gen int, done, cancel chan struct{}, acct *Account, cwd, path string, env []string) {
	defer close(done)
	quick := 0
	for {
		s.mu.Lock()
		if svc.gen != gen || s.halted {
			s.mu.Unlock()
			return
		}
		argv := svc.spec.Command
		policy := svc.spec.Restart
		started := time.Now()
		pid, status, err := s.spawn(svc, acct, cwd, path, argv, env)
		code := 0
		if err != nil {
			svc.log.Write([]byte(fmt.Sprintf("boxd: %s: %v\n", argv[0], errnoOf(err))))
			code = 127
			svc.pid = 0
		} else {
			svc.pid = pid
			svc.state = "running"
		}
		s.mu.Unlock()
		if err == nil {
			ws := <-status
			switch {
			case ws.Exited():
				code = ws.ExitStatus()
			case ws.Signaled():
				code = 128 + int(ws.Signal())
			}
			// What it left in its group (only the group: the pid itself is reaped and may be reused).
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		s.mu.Lock()
		c := code
		svc.lastExit = &c
		svc.pid = 0
		if svc.gen != gen || s.halted {
			s.mu.Unlock()
			return // stopped (the stopper sets the state)
		}
		again := policy == "" || policy == "always" || (policy == "on-failure" && code != 0)
		if !again {
			if code == 0 {
				svc.state = "exited"
			} else {
				svc.state = "failed"
			}
			s.mu.Unlock()
			return
		}
		if time.Since(started) >= stableRun {
			quick = 0
		}
		delay := backoff(quick)
		quick++
		svc.restarts++
		svc.state = "restarting"
		s.mu.Unlock()
		select {
		case <-time.After(delay):
		case <-cancel:
		}
	}
}

// spawn starts the service's process: its own session and group, output to its log (s.mu held).
func (s *Supervisor) spawn(svc *service, acct *Account, cwd, path string, argv, env []string) (int, <-chan syscall.WaitStatus, error) {
	null, err := os.OpenFile(os.DevNull, os.O_RDONLY, 0)
	if err != nil {
		return 0, nil, err
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	_ = w.Chown(int(acct.UID), int(acct.GID))
	attr := &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: acct.UID, Gid: acct.GID, Groups: acct.Groups}}
	pid, status, err := s.reaper.Start(func() (int, error) {
		p, err := os.StartProcess(path, argv, &os.ProcAttr{Dir: cwd, Env: env, Files: []*os.File{null, w, w}, Sys: attr})
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		_ = p.Release()
		return pid, nil
	})
	_ = w.Close()
	if err != nil {
		_ = r.Close()
		return 0, nil, err
	}
	go svc.log.copyFrom(r)
	return pid, status, nil
}

// stopLocked ends svc's run loop and its process: the stop signal to its group, then SIGKILL
// after the grace. Called and returns with s.mu held (released while waiting).
func (s *Supervisor) stopLocked(svc *service, sig syscall.Signal, grace time.Duration) {
	svc.gen++
	done := svc.done
	pid := svc.pid
	if done == nil {
		if svc.state != "exited" && svc.state != "failed" {
			svc.state = "stopped"
		}
		return
	}
	close(svc.cancel)
	svc.done, svc.cancel = nil, nil
	select {
	case <-done:
		// The run loop had ended by itself (exited or failed): that stays its state.
		return
	default:
	}
	s.mu.Unlock()
	// The group, not the pid: the service is its group's leader, and once reaped its pid may be
	// reused (a group id is not, while the group has members).
	if pid > 0 {
		_ = syscall.Kill(-pid, sig)
		if sig != syscall.SIGCONT {
			_ = syscall.Kill(-pid, syscall.SIGCONT)
		}
	}
	select {
	case <-done:
	case <-time.After(grace):
		if pid > 0 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		<-done
	}
	s.mu.Lock()
	svc.state = "stopped"
}

// stateOf is the answer for one service (s.mu held).
func (svc *service) stateOf() ServiceState {
	st := ServiceState{Name: svc.name, State: svc.state, Pid: svc.pid, Restarts: svc.restarts, LastExitCode: svc.lastExit}
	if svc.raw != nil {
		st.Spec, _ = json.Marshal(svc.raw)
	}
	return st
}

// Halt stops restarting anything (the box is stopping) and gives each running service its own
// stop signal (the box's stop then sends SIGTERM to everything left).
func (s *Supervisor) Halt() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.halted = true
	for _, svc := range s.services {
		if svc.pid > 0 && svc.spec != nil {
			if sig := svc.spec.stopSignal(); sig != syscall.SIGTERM {
				_ = syscall.Kill(-svc.pid, sig)
			}
		}
	}
}
