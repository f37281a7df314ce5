package main

import (
	"encoding/json"
	"net"
	"os"
	"syscall"
	"time"
)

// Server answers the node's connections, one request each.
type Server struct {
	reaper *Reaper
	sup    *Supervisor
}

// firstFrameTimeout: a connection that names no request in this time is dropped.
const firstFrameTimeout = 10 * time.Second

func (s *Server) handle(c net.Conn) {
	defer c.Close()
	defer linger(c)
	w := &Writer{w: c}
	_ = c.SetReadDeadline(time.Now().Add(firstFrameTimeout))
	f, err := ReadFrame(c)
	if err != nil {
		if err == ErrFrameTooLarge {
			_ = w.JSON(FrameError, failf("protocol", "", "frame too large"))
		}
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	switch f.Type {
	case ReqHello:
		_ = w.JSON(FrameHello, Hello{Protocol: ProtocolVersion, Version: Version, Pid: os.Getpid()})
	case ReqExec:
		var req ExecRequest
		if err := json.Unmarshal(f.Payload, &req); err != nil {
			_ = w.JSON(FrameError, failf("protocol", "", "exec request is not valid JSON: %v", err))
			return
		}
		if req.V != ProtocolVersion {
			_ = w.JSON(FrameError, failf("protocol", "", "protocol version %d is not served (boxd %s speaks %d)", req.V, Version, ProtocolVersion))
			return
		}
		s.exec(c, w, &req)
	case ReqStat, ReqList, ReqRead, ReqWrite, ReqDelete, ReqMkdir, ReqChmod:
		s.files(c, w, f.Type, f.Payload)
	case ReqService:
		s.services(c, w, f.Payload)
	case ReqShutdown:
		var req ShutdownRequest
		if err := json.Unmarshal(f.Payload, &req); err != nil || req.V != ProtocolVersion {
			_ = w.JSON(FrameError, failf("protocol", "", "bad shutdown request"))
			return
		}
		_ = w.Write(FrameOK, nil)
		_ = c.Close()
		s.sup.Halt()
		shutdown(time.Duration(req.GraceMs) * time.Millisecond)
	default:
		_ = w.JSON(FrameError, failf("protocol", "", "unknown request %q", f.Type))
	}
}

// shutdown stops the box: SIGTERM (and SIGCONT, for stopped ones) to every process in it, then
// PID 1 exits once they are gone or the grace has run out (the kernel kills what is left when
// a pid namespace's init exits).
func shutdown(grace time.Duration) {
	_ = syscall.Kill(-1, syscall.SIGTERM)
	_ = syscall.Kill(-1, syscall.SIGCONT)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) && Children() > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(-1, syscall.SIGKILL)
	os.Exit(0)
}
