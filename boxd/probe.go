package main

// Readiness probes: one look at a port on the box's own loopback, from inside the box's network
// namespace (boxd is the box's PID 1), so a service bound to 127.0.0.1 is reachable too. The node
// loops on these until a service's ready gate passes or its time is up (docs/services.md).

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

type ProbeRequest struct {
	// TCP: connect only. HTTP: a path fetched with GET; Status the code wanted (0: any 2xx).
	Port   int    `json:"port"`
	HTTP   string `json:"http,omitempty"`
	Status int    `json:"status,omitempty"`
}

type ProbeAnswer struct {
	OK bool `json:"ok"`
	// Status is the HTTP status answered (0 for TCP or when none was).
	Status int `json:"status,omitempty"`
	// Issue says why the probe did not pass.
	Issue string `json:"issue,omitempty"`
}

// probeTimeout bounds one look: a gate loops on looks, so a service that accepts and then says
// nothing is a failed look, not a hung call.
const probeTimeout = 2 * time.Second

func probe(req *ProbeRequest) (*ProbeAnswer, *Failure) {
	if req == nil || req.Port < 1 || req.Port > 65535 {
		return nil, failf("input", "port", "a probe needs a port 1…65535")
	}
	if req.HTTP != "" && (!strings.HasPrefix(req.HTTP, "/") || len(req.HTTP) > 2048 || strings.ContainsAny(req.HTTP, " \r\n\x00")) {
		return nil, failf("input", "http", "a probe path starts with / and has no spaces or line breaks")
	}
	if req.Status != 0 && (req.Status < 100 || req.Status > 599) {
		return nil, failf("input", "status", "a probe status is 100…599")
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(req.Port))
	deadline := time.Now().Add(probeTimeout)
	c, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return &ProbeAnswer{Issue: fmt.Sprintf("nothing accepts connections on port %d", req.Port)}, nil
	}
	defer c.Close()
	if req.HTTP == "" {
		return &ProbeAnswer{OK: true}, nil
	}
	_ = c.SetDeadline(deadline)
	// HTTP/1.0 and Connection: close: the answer's status line is all a gate reads.
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: boxd-ready\r\nConnection: close\r\n\r\n", req.HTTP, addr); err != nil {
		return &ProbeAnswer{Issue: fmt.Sprintf("port %d took the connection but not the request", req.Port)}, nil
	}
	line, err := bufio.NewReaderSize(c, 512).ReadString('\n')
	if err != nil && line == "" {
		return &ProbeAnswer{Issue: fmt.Sprintf("GET %s on port %d: no answer", req.HTTP, req.Port)}, nil
	}
	fields := strings.Fields(line)
	if len(fields) < 2 || !strings.HasPrefix(fields[0], "HTTP/") {
		return &ProbeAnswer{Issue: fmt.Sprintf("GET %s on port %d: not an HTTP answer", req.HTTP, req.Port)}, nil
	}
	code, err := strconv.Atoi(fields[1])
	if err != nil || code < 100 || code > 599 {
		return &ProbeAnswer{Issue: fmt.Sprintf("GET %s on port %d: not an HTTP status", req.HTTP, req.Port)}, nil
	}
	if (req.Status == 0 && code >= 200 && code < 300) || code == req.Status {
		return &ProbeAnswer{OK: true, Status: code}, nil
	}
	want := "a 2xx"
	if req.Status != 0 {
		want = strconv.Itoa(req.Status)
	}
	return &ProbeAnswer{Status: code, Issue: fmt.Sprintf("GET %s on port %d answered %d, not %s", req.HTTP, req.Port, code, want)}, nil
}
