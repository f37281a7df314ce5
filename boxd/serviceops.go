package main

// The node's service calls: one request frame `U` with an op, answered as docs/boxd.md says.

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"
)

const ReqService = 'U'

type ServiceRequest struct {
	V    int             `json:"v"`
	Op   string          `json:"op"` // start list get stop restart delete logs probe
	Name string          `json:"name,omitempty"`
	Spec json.RawMessage `json:"spec,omitempty"` // start: the spec to start (replacing one of that name)
	// stop: overrides of the spec's stop signal and grace
	Signal  string `json:"signal,omitempty"`
	GraceMs *int64 `json:"graceMs,omitempty"`
	// stop: the service failed (its ready gate did): it is stopped and listed as failed, this
	// reason in its log
	Fail string `json:"fail,omitempty"`
	// logs
	Tail   *int `json:"tail,omitempty"` // absent: 100; 0: none (follow only)
	Follow bool `json:"follow,omitempty"`
	// probe
	Probe *ProbeRequest `json:"probe,omitempty"`
}

type StartAnswer struct {
	Service  ServiceState `json:"service"`
	Replaced bool         `json:"replaced"`
}

const maxTail = 10000

func (s *Server) services(c net.Conn, w *Writer, payload []byte) {
	var req ServiceRequest
	if err := json.Unmarshal(payload, &req); err != nil || req.V != ProtocolVersion {
		_ = w.JSON(FrameError, failf("protocol", "", "bad service request"))
		return
	}
	sup := s.sup
	if req.Op != "list" && req.Op != "start" && req.Op != "probe" && !validServiceName(req.Name) {
		_ = w.JSON(FrameError, failf("input", "name", "invalid service name %q", req.Name))
		return
	}
	switch req.Op {
	case "list":
		for _, st := range sup.list() {
			if err := w.JSON(FrameAnswer, st); err != nil {
				return
			}
		}
		_ = w.Write(FrameEnd, nil)
	case "get":
		st, fl := sup.get(req.Name)
		answer(w, st, fl)
	case "start":
		if len(req.Spec) == 0 {
			st, fl := sup.startStored(req.Name, false)
			answer(w, st, fl)
			return
		}
		a, fl := sup.start(req.Name, req.Spec)
		answer(w, a, fl)
	case "restart":
		st, fl := sup.startStored(req.Name, true)
		answer(w, st, fl)
	case "stop":
		var grace *time.Duration
		if req.GraceMs != nil {
			if *req.GraceMs < 0 || *req.GraceMs > 3600_000 {
				_ = w.JSON(FrameError, failf("input", "stop.grace_secs", "grace must be 0…3600 s"))
				return
			}
			g := time.Duration(*req.GraceMs) * time.Millisecond
			grace = &g
		}
		if len(req.Fail) > 4096 {
			_ = w.JSON(FrameError, failf("input", "fail", "a failure reason is at most 4096 bytes"))
			return
		}
		st, fl := sup.stop(req.Name, req.Signal, grace, req.Fail)
		answer(w, st, fl)
	case "delete":
		if fl := sup.remove(req.Name); fl != nil {
			_ = w.JSON(FrameError, fl)
			return
		}
		_ = w.Write(FrameOK, nil)
	case "logs":
		sup.logs(c, w, &req)
	case "probe":
		a, fl := probe(req.Probe)
		answer(w, a, fl)
	default:
		_ = w.JSON(FrameError, failf("input", "op", "unknown service op %q", req.Op))
	}
}

func answer(w *Writer, v interface{}, fl *Failure) {
	if fl != nil {
		_ = w.JSON(FrameError, fl)
		return
	}
	_ = w.JSON(FrameAnswer, v)
}

func validServiceName(n string) bool {
	return serviceNameRE.MatchString(n) && !strings.Contains(n, "--")
}

func notFound(name string) *Failure {
	return failf("not_found", "name", "no service %q in the box", name)
}

// list: every spec file (a tombstone for one that does not load) and every service boxd runs
// whose file is gone, by name.
func (s *Supervisor) list() []ServiceState {
	seen := map[string]bool{}
	var out []ServiceState
	entries, _ := os.ReadDir(servicesDir)
	for _, e := range entries {
		fn := e.Name()
		name := strings.TrimSuffix(fn, ".json")
		if name == fn || !validServiceName(name) {
			continue
		}
		seen[name] = true
		out = append(out, s.stateFromFile(name))
	}
	s.mu.Lock()
	for name, svc := range s.services {
		if !seen[name] && svc.raw != nil {
			out = append(out, svc.stateOf())
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// stateFromFile is a service as its spec file says, with what boxd knows of it running.
func (s *Supervisor) stateFromFile(name string) ServiceState {
	_, raw, err := loadSpec(specPath(name))
	if err != nil {
		return ServiceState{Name: name, State: "corrupt", Error: "the spec file " + specPath(name) + " does not load: " + err.Error()}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := ServiceState{Name: name, State: "stopped"}
	if svc := s.services[name]; svc != nil {
		st = svc.stateOf()
	}
	st.Spec, _ = json.Marshal(raw)
	return st
}

func (s *Supervisor) get(name string) (*ServiceState, *Failure) {
	if _, err := os.Lstat(specPath(name)); err == nil {
		st := s.stateFromFile(name)
		return &st, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if svc := s.services[name]; svc != nil && svc.raw != nil {
		st := svc.stateOf()
		return &st, nil
	}
	return nil, notFound(name)
}

// start places a new spec (replacing the service of that name) and starts it. Nothing changes
// when the spec does not check or its user, cwd or command cannot be found in the box.
func (s *Supervisor) start(name string, spec json.RawMessage) (*StartAnswer, *Failure) {
	var probe struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(spec, &probe)
	if name == "" {
		name = probe.Name
	}
	if !validServiceName(name) {
		return nil, failf("input", "name", "invalid service name %q", name)
	}
	if probe.Name != name {
		return nil, failf("input", "name", "the spec names %q, not %q", probe.Name, name)
	}
	sp, raw, err := parseSpec(spec, name)
	if err != nil {
		if fl, ok := err.(*Failure); ok {
			return nil, fl
		}
		return nil, failf("input", "spec", "the service spec does not load: %v", err)
	}
	acct, cwd, path, env, fl := prepareService(sp)
	if fl != nil {
		return nil, fl
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halted {
		return nil, failf("conflict", "", "the box is stopping")
	}
	_, statErr := os.Lstat(specPath(sp.Name))
	replaced := statErr == nil
	// The new spec is written first: a write that fails leaves the old service as it was.
	sp.Disabled = false
	setDisabled(raw, false)
	if err := saveSpec(raw, sp.Name); err != nil {
		return nil, fileFailure(err)
	}
	svc := s.service(sp.Name)
	if svc.raw != nil {
		replaced = true
	}
	if svc.done != nil {
		s.stopLocked(svc, svc.spec.stopSignal(), svc.spec.grace())
	}
	svc.spec, svc.raw = sp, raw
	svc.restarts, svc.lastExit = 0, nil
	s.launch(svc, acct, cwd, path, env)
	s.waitStarted(svc)
	return &StartAnswer{Service: svc.stateOf(), Replaced: replaced}, nil
}

// waitStarted gives a just-launched service a moment to have its pid (s.mu held).
func (s *Supervisor) waitStarted(svc *service) {
	gen := svc.gen
	for i := 0; i < 200 && svc.gen == gen && svc.state == "starting"; i++ {
		s.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		s.mu.Lock()
	}
}

// startStored starts the service from its spec file (again, when restart), enabling it.
func (s *Supervisor) startStored(name string, restart bool) (*ServiceState, *Failure) {
	s.ops.Lock()
	defer s.ops.Unlock()
	sp, raw, err := loadSpec(specPath(name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, notFound(name)
		}
		return nil, failf("input", "spec", "the spec file %s does not load: %v", specPath(name), err)
	}
	acct, cwd, path, env, fl := prepareService(sp)
	if fl != nil {
		return nil, fl
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halted {
		return nil, failf("conflict", "", "the box is stopping")
	}
	svc := s.service(name)
	running := svc.done != nil && (svc.state == "running" || svc.state == "starting" || svc.state == "restarting")
	if running && !restart {
		st := svc.stateOf()
		return &st, nil
	}
	if svc.done != nil {
		s.stopLocked(svc, svc.spec.stopSignal(), svc.spec.grace())
	}
	if sp.Disabled {
		sp.Disabled = false
		setDisabled(raw, false)
		if err := saveSpec(raw, name); err != nil {
			return nil, fileFailure(err)
		}
	}
	svc.spec, svc.raw = sp, raw
	s.launch(svc, acct, cwd, path, env)
	s.waitStarted(svc)
	st := svc.stateOf()
	return &st, nil
}

// stop stops the service (its spec's signal and grace unless given) and marks it disabled, so
// the box's next start leaves it stopped.
func (s *Supervisor) stop(name, signal string, grace *time.Duration, fail string) (*ServiceState, *Failure) {
	s.ops.Lock()
	defer s.ops.Unlock()
	sp, raw, err := loadSpec(specPath(name))
	s.mu.Lock()
	defer s.mu.Unlock()
	svc := s.services[name]
	if svc == nil && err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, notFound(name)
		}
		return nil, failf("input", "spec", "the spec file %s does not load: %v", specPath(name), err)
	}
	if svc == nil {
		svc = s.service(name)
		svc.spec, svc.raw = sp, raw
	}
	use := svc.spec
	if use == nil {
		use = sp
	}
	if use == nil {
		use = &ServiceSpec{}
	}
	sig := use.stopSignal()
	if signal != "" {
		var ok bool
		if sig, ok = parseSignal(signal); !ok {
			return nil, failf("input", "stop.signal", "unknown signal %q", signal)
		}
	}
	g := use.grace()
	if grace != nil {
		g = *grace
	}
	s.stopLocked(svc, sig, g)
	if fail != "" {
		svc.state = "failed"
		_, _ = svc.log.Write([]byte("boxd: the service failed: " + strings.ReplaceAll(fail, "\n", " ") + "\n"))
	}
	if err == nil && !sp.Disabled {
		setDisabled(raw, true)
		_ = saveSpec(raw, name)
		svc.raw = raw
	}
	st := svc.stateOf()
	return &st, nil
}

// remove stops the service and deletes its spec file and its logs.
func (s *Supervisor) remove(name string) *Failure {
	s.ops.Lock()
	defer s.ops.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	svc := s.services[name]
	_, statErr := os.Lstat(specPath(name))
	if svc == nil && statErr != nil {
		return notFound(name)
	}
	if svc != nil {
		if svc.spec != nil {
			s.stopLocked(svc, svc.spec.stopSignal(), svc.spec.grace())
		} else {
			s.stopLocked(svc, syscall.SIGTERM, 10*time.Second)
		}
		svc.log.close()
		delete(s.services, name)
	}
	if err := os.Remove(specPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fileFailure(err)
	}
	removeLogs(name)
	return nil
}

// logs answers the last lines of the service's log as data frames, then, with follow, what it
// writes next until the node closes; without, an end frame.
func (s *Supervisor) logs(c net.Conn, w *Writer, req *ServiceRequest) {
	if _, fl := s.get(req.Name); fl != nil {
		_ = w.JSON(FrameError, fl)
		return
	}
	n := 100
	if req.Tail != nil {
		n = *req.Tail
	}
	if n < 0 {
		n = 0
	}
	if n > maxTail {
		n = maxTail
	}
	tail, f, off := readTail(req.Name, n)
	if f != nil {
		defer func() { _ = f.Close() }()
	}
	if err := w.JSON(FrameAnswer, map[string]bool{"follow": req.Follow}); err != nil {
		return
	}
	if sendChunks(w, tail) != nil {
		return
	}
	if !req.Follow {
		_ = w.Write(FrameEnd, nil)
		return
	}
	gone := make(chan struct{})
	go func() {
		buf := make([]byte, 256)
		for {
			if _, err := c.Read(buf); err != nil {
				close(gone)
				return
			}
		}
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-gone:
			return
		case <-tick.C:
		}
		// A rotation (or a first write) gives a new file: go on from its start.
		var cur os.FileInfo
		var statErr error
		blocking(func() { cur, statErr = os.Stat(logPath(req.Name)) })
		if statErr == nil {
			if f == nil || !sameFile(f, cur) {
				var nf *os.File
				var err error
				blocking(func() { nf, err = openLog(logPath(req.Name)) })
				if err == nil {
					if f != nil {
						// What the old file got after we last read it, before it was rotated.
						if sendRest(w, f, off, buf) != nil {
							_ = nf.Close()
							return
						}
						_ = f.Close()
					}
					f, off = nf, 0
				}
			}
		}
		if f == nil {
			continue
		}
		for {
			var n int
			blocking(func() { n, _ = f.ReadAt(buf, off) })
			if n <= 0 {
				break
			}
			off += int64(n)
			if w.Write(FrameData, buf[:n]) != nil {
				return
			}
		}
	}
}

func sendRest(w *Writer, f *os.File, off int64, buf []byte) error {
	for {
		var n int
		blocking(func() { n, _ = f.ReadAt(buf, off) })
		if n <= 0 {
			return nil
		}
		off += int64(n)
		if err := w.Write(FrameData, buf[:n]); err != nil {
			return err
		}
	}
}

func sameFile(f *os.File, st os.FileInfo) bool {
	fst, err := f.Stat()
	return err == nil && os.SameFile(fst, st)
}

func sendChunks(w *Writer, b []byte) error {
	for len(b) > 0 {
		n := len(b)
		if n > 64<<10 {
			n = 64 << 10
		}
		if err := w.Write(FrameData, b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
