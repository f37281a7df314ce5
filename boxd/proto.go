package main

// The boxd wire protocol (docs/boxd.md): frames of a one-byte type, a four-byte big-endian
// payload length and the payload, one exchange per connection. The first frame names the
// request; exec then streams until boxd sends the exit frame and closes.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// ProtocolVersion is the major version of the protocol: a request carrying another is refused.
const ProtocolVersion = 1

// MaxFrame bounds every payload, in both directions.
const MaxFrame = 1 << 20

// Requests (the first frame of a connection).
const (
	ReqExec     = 'X' // JSON ExecRequest
	ReqHello    = 'V' // empty: answered by FrameHello
	ReqShutdown = 'Q' // JSON ShutdownRequest: answered by FrameOK, then the box stops
)

// Frames during an exec, node to boxd.
const (
	FrameStdin    = 'i' // bytes for the process's stdin (or its terminal)
	FrameStdinEOF = 'c' // closes stdin (pipes); a terminal's end is typed by the node
	FrameResize   = 'r' // JSON {cols, rows}
	FrameSignal   = 'k' // JSON {signal, group}
)

// Frames boxd sends.
const (
	FrameHello    = 'v' // JSON Hello
	FrameStarted  = 's' // JSON {pid}: the process runs (pid inside the box)
	FrameStdout   = 'o'
	FrameStderr   = 'e'
	FrameExit     = 'x' // JSON Exit: the last frame of an exec
	FrameError    = 'f' // JSON Failure: the request could not be served; the last frame
	FrameOK       = 'y' // empty
	FrameStdinAck = 'w' // JSON {n}: n more bytes of stdin were written to the process
)

// StdinWindow is how many stdin bytes the node may have sent and not yet seen acknowledged:
// boxd never has to stop reading the connection (signals and resizes keep flowing while a
// process does not read its input), and a node that sends more breaks the protocol.
const StdinWindow = 1 << 20

// ErrFrameTooLarge is a frame whose length passes MaxFrame: the connection is dropped.
var ErrFrameTooLarge = errors.New("frame too large")

type Frame struct {
	Type    byte
	Payload []byte
}

// ReadFrame reads one frame; a length past MaxFrame is refused before anything is allocated.
func ReadFrame(r io.Reader) (Frame, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return Frame{}, ErrFrameTooLarge
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return Frame{Type: hdr[0], Payload: p}, nil
}

// Writer serialises frames from several goroutines onto one connection.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
}

func (fw *Writer) Write(t byte, p []byte) error {
	if len(p) > MaxFrame {
		return ErrFrameTooLarge
	}
	var hdr [5]byte
	hdr[0] = t
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	fw.mu.Lock()
	defer fw.mu.Unlock()
	// Header and payload in one writev, without copying the payload.
	bufs := net.Buffers{hdr[:], p}
	if _, err := bufs.WriteTo(fw.w); err != nil {
		return err
	}
	return nil
}

// frameOf sends a frame of n payload bytes that send writes to the connection itself (a splice):
// the header first, then send, with the connection held for both.
func (fw *Writer) frameOf(t byte, n int, send func() error) error {
	if n > MaxFrame {
		return ErrFrameTooLarge
	}
	var hdr [5]byte
	hdr[0] = t
	binary.BigEndian.PutUint32(hdr[1:], uint32(n))
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if _, err := fw.w.Write(hdr[:]); err != nil {
		return err
	}
	return send()
}

// JSON sends v as a frame's payload (without HTML escaping: `<` stays one byte, so a payload
// is no larger than its content needs).
func (fw *Writer) JSON(t byte, v interface{}) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	return fw.Write(t, bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}

// ExecRequest: what to run. Ids are the box's own; env is complete (the node merges the box's
// environment with the call's); cwd is resolved inside the box.
type ExecRequest struct {
	V      int      `json:"v"`
	Argv   []string `json:"argv"`
	Env    []string `json:"env"`
	Cwd    string   `json:"cwd"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups"`
	// User, when set, is resolved in the box (NAME, NAME:GROUP, UID, UID:GID) and replaces
	// uid, gid and groups.
	User   string `json:"user,omitempty"`
	TTY    bool   `json:"tty"`
	Echo   bool   `json:"echo"`
	Cols   uint16 `json:"cols"`
	Rows   uint16 `json:"rows"`
	Stdin  bool   `json:"stdin"`
	Detach bool   `json:"detach"`
	// TimeoutMs > 0: the process and its group are killed then, and the exit says timedOut.
	TimeoutMs int64 `json:"timeoutMs"`
	// NoHup (1.3.0 on): when the node goes away, the process is left running instead of killed;
	// its output is read and dropped from then on, a pipe stdin gets EOF, a terminal stays open.
	NoHup bool `json:"noHup,omitempty"`
}

type ShutdownRequest struct {
	V       int   `json:"v"`
	GraceMs int64 `json:"graceMs"`
}

type Hello struct {
	Protocol int    `json:"protocol"`
	Version  string `json:"version"`
	Pid      int    `json:"pid"`
}

type Started struct {
	Pid int `json:"pid"`
}

type Resize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

type SignalReq struct {
	Signal int  `json:"signal"`
	Group  bool `json:"group"`
}

type Exit struct {
	Code     int  `json:"code"`
	Signal   int  `json:"signal,omitempty"`
	TimedOut bool `json:"timedOut,omitempty"`
}

// Failure kinds: "input" (a field of the request is wrong), "cwd" (the working directory
// cannot be entered by the user), "protocol" (bad frames), "internal".
type Failure struct {
	Kind    string `json:"kind"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func failf(kind, field, format string, args ...interface{}) *Failure {
	return &Failure{Kind: kind, Field: field, Message: fmt.Sprintf(format, args...)}
}

func (f *Failure) Error() string { return f.Message }
