package main

// File operations, run by boxd inside the box's root and mount namespace, as root of the box:
// every path resolves in the box by construction (its symlinks, its /proc), never on the host.

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Requests.
const (
	ReqStat   = 'S' // FileRequest → FrameAnswer FileInfo
	ReqList   = 'L' // FileRequest → FrameAnswer {entries, truncated}
	ReqRead   = 'R' // FileRequest → FrameAnswer FileInfo, FrameData…, FrameEnd
	ReqWrite  = 'W' // FileRequest, then FrameStdin… FrameStdinEOF → FrameAnswer FileInfo
	ReqDelete = 'D' // FileRequest → FrameOK
	ReqMkdir  = 'M' // FileRequest → FrameAnswer FileInfo
	ReqChmod  = 'C' // FileRequest → FrameAnswer FileInfo
)

const (
	FrameAnswer = 'a'
	FrameData   = 'd'
	FrameEnd    = 'z'
)

// fileReadBuf is how much of a file one read (and one data frame) carries; fileWriteBuf how
// much one write of an upload does.
const (
	fileReadBuf  = 512 << 10
	fileWriteBuf = 512 << 10
	// fileSendBuf: the send buffer a read's connection asks for. The kernel caps the ask at
	// net.core.wmem_max, then doubles it: 4 MiB in flight where wmem_max is 2 MiB or more
	// (scripts/install-host.sh makes it so), 416 KiB on a default kernel (208 KiB). Measured: a
	// 256 MiB download through the api 534–671 ms with the default, 395–511 ms with this (raw cat
	// of the file 250–305 ms; docs/decisions.md "A read's connection holds 4 MiB in flight").
	// What waits in it is the box's memory (af_unix charges the sender's cgroup), as the blocks are.
	fileSendBuf = 2 << 20
	// relayDepth: one block filled while the other drains. boxd's memory counts in its box's
	// cgroup: a transfer holds 1 MiB of blocks (an upload 512 KiB more of socket buffer; a read
	// up to fileSendBuf's 4 MiB of socket buffer, pages of the box's own cache when spliced).
	relayDepth = 2
)

// errNodeGone: the node's connection ended in the middle of a request.
var errNodeGone = errors.New("the node went away")

// maxListEntries bounds a listing's answer (one frame).
const maxListEntries = 5000

type FileRequest struct {
	V         int     `json:"v"`
	Path      string  `json:"path"`
	Mode      *uint32 `json:"mode,omitempty"`
	Recursive bool    `json:"recursive,omitempty"`
	Parents   bool    `json:"parents,omitempty"`
}

type FileInfo struct {
	Name   string `json:"name"`
	Path   string `json:"path,omitempty"`
	Type   string `json:"type"` // file, dir, symlink, other
	Size   int64  `json:"size"`
	Mode   uint32 `json:"mode"`
	Mtime  string `json:"mtime"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Target string `json:"target,omitempty"`
}

func infoOf(p string, st os.FileInfo) FileInfo {
	fi := FileInfo{Name: st.Name(), Path: p, Size: st.Size(), Mode: unixMode(st.Mode()), Mtime: st.ModTime().UTC().Format(time.RFC3339Nano)}
	switch {
	case st.Mode().IsRegular():
		fi.Type = "file"
	case st.IsDir():
		fi.Type = "dir"
	case st.Mode()&fs.ModeSymlink != 0:
		fi.Type = "symlink"
		if t, err := os.Readlink(p); err == nil {
			fi.Target = t
		}
	default:
		fi.Type = "other"
	}
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		fi.UID, fi.GID = s.Uid, s.Gid
	}
	return fi
}

func unixMode(m fs.FileMode) uint32 {
	out := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		out |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		out |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		out |= 0o1000
	}
	return out
}

// fileFailure maps an OS error to a failure the node can turn into a status.
func fileFailure(err error) *Failure {
	var kind string
	switch {
	// First: Go counts ENOTEMPTY as fs.ErrExist.
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EINVAL):
		kind = "invalid"
	case errors.Is(err, fs.ErrNotExist):
		kind = "not_found"
	case errors.Is(err, fs.ErrExist):
		kind = "exists"
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		kind = "permission"
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		kind = "no_space"
	case errors.Is(err, syscall.EBUSY):
		// A mount point (the agent's own /.boxhost/boxd, a volume's top): in use, not the agent's fault.
		kind = "busy"
	default:
		kind = "internal"
	}
	msg := err.Error()
	var pe *fs.PathError
	if errors.As(err, &pe) {
		msg = pe.Op + " " + pe.Path + ": " + pe.Err.Error()
	}
	return &Failure{Kind: kind, Field: "path", Message: msg}
}

func cleanPath(p string) (string, *Failure) {
	if !strings.HasPrefix(p, "/") || strings.IndexByte(p, 0) >= 0 || len(p) > 4096 {
		return "", failf("input", "path", "path must be an absolute path without NUL")
	}
	return filepath.Clean(p), nil
}

func (s *Server) files(c net.Conn, w *Writer, t byte, payload []byte) {
	var req FileRequest
	if err := json.Unmarshal(payload, &req); err != nil || req.V != ProtocolVersion {
		_ = w.JSON(FrameError, failf("protocol", "", "bad file request"))
		return
	}
	p, f := cleanPath(req.Path)
	if f != nil {
		_ = w.JSON(FrameError, f)
		return
	}
	if req.Mode != nil && *req.Mode > 0o7777 {
		_ = w.JSON(FrameError, failf("input", "mode", "mode must be at most 07777"))
		return
	}
	fail := func(err error) { _ = w.JSON(FrameError, fileFailure(err)) }
	// What p is now, as the answer.
	answerInfo := func() {
		var st os.FileInfo
		var err error
		blocking(func() { st, err = os.Lstat(p) })
		if err != nil {
			fail(err)
			return
		}
		_ = w.JSON(FrameAnswer, infoOf(p, st))
	}
	switch t {
	case ReqStat:
		answerInfo()
	case ReqList:
		var entries []FileInfo
		var truncated bool
		var err error
		blocking(func() { entries, truncated, err = listDir(p) })
		if err != nil {
			fail(err)
			return
		}
		_ = w.JSON(FrameAnswer, map[string]interface{}{"entries": entries, "truncated": truncated})
	case ReqRead:
		var fh *os.File
		var st os.FileInfo
		var err error
		openStat := func(open func() (*os.File, error)) {
			if fh, err = open(); err == nil {
				if st, err = fh.Stat(); err != nil {
					_ = fh.Close()
				}
			}
		}
		blocking(func() { openStat(func() (*os.File, error) { return openRegular(p, syscall.O_RDONLY, true) }) })
		if err == errNotRegular {
			// A FIFO or a device: opened outside the slots, as its open may wait for a writer
			// (it holds a thread of its own until then; its reads go through Go's poller).
			openStat(func() (*os.File, error) { return os.Open(p) })
		}
		if err != nil {
			fail(err)
			return
		}
		defer blocking(func() { _ = fh.Close() })
		if st.IsDir() {
			fail(&fs.PathError{Op: "read", Path: p, Err: syscall.EISDIR})
			return
		}
		if w.JSON(FrameAnswer, infoOf(p, st)) != nil {
			return
		}
		// The connection holds more of the file in flight: with the default send buffer
		// (≈208 KiB) each 512 KiB block waited on the node's reads, and the node's reads on it.
		if uc, ok := c.(*net.UnixConn); ok {
			_ = uc.SetWriteBuffer(fileSendBuf)
		}
		// A regular file is spliced (splice.go); anything else, or a file that cannot be, copied.
		regular := st.Mode().IsRegular()
		fillErr, sendErr := errNoSplice, error(nil)
		if regular {
			fillErr, sendErr = spliceData(fh, c, w, fileReadBuf)
		}
		if fillErr == errNoSplice {
			fillErr, sendErr = s.copyData(fh, w, regular)
		}
		switch {
		case sendErr != nil: // the node went away
		case fillErr != nil:
			fail(fillErr)
		default:
			_ = w.Write(FrameEnd, nil)
		}
	case ReqWrite:
		if s.writeFile(c, w, p, &req) {
			answerInfo()
		}
	case ReqDelete:
		if p == "/" {
			_ = w.JSON(FrameError, failf("input", "path", "the root cannot be deleted"))
			return
		}
		var err error
		blocking(func() {
			if req.Recursive {
				if _, err = os.Lstat(p); err == nil {
					err = os.RemoveAll(p)
				}
			} else {
				err = os.Remove(p)
			}
		})
		if err != nil {
			fail(err)
			return
		}
		_ = w.Write(FrameOK, nil)
	case ReqMkdir:
		mode := os.FileMode(0o755)
		if req.Mode != nil {
			mode = os.FileMode(*req.Mode & 0o777)
		}
		var err error
		blocking(func() {
			if req.Parents {
				err = os.MkdirAll(p, mode)
			} else {
				err = os.Mkdir(p, mode)
			}
		})
		if err != nil {
			fail(err)
			return
		}
		answerInfo()
	case ReqChmod:
		if req.Mode == nil {
			_ = w.JSON(FrameError, failf("input", "mode", "mode is required"))
			return
		}
		var err error
		blocking(func() { err = syscall.Chmod(p, *req.Mode) })
		if err != nil {
			fail(&fs.PathError{Op: "chmod", Path: p, Err: err})
			return
		}
		answerInfo()
	}
}

// copyData sends fh's bytes as data frames read into boxd's memory. Large reads, large frames,
// the next block read while the last one goes out: a file streams at the slower side's pace,
// not at the sum of both. A regular file fills whole blocks; anything else (a FIFO, a device)
// goes on with what each read gives, so bytes that come slowly are not held back.
func (s *Server) copyData(fh *os.File, w *Writer, regular bool) (fillErr, sendErr error) {
	return relay(fileReadBuf, relayDepth, func(b []byte) (n int, err error) {
		if !regular {
			// A FIFO or a device may wait for ever: never in a slot.
			return fh.Read(b)
		}
		blocking(func() { n, err = io.ReadFull(fh, b) })
		if err == io.ErrUnexpectedEOF {
			err = io.EOF
		}
		return n, err
	}, func(b []byte) error { return w.Write(FrameData, b) })
}

// listDir is p's entries, sorted by name, at most maxListEntries of them.
func listDir(p string) ([]FileInfo, bool, error) {
	d, err := os.Open(p)
	if err != nil {
		return nil, false, err
	}
	defer d.Close()
	names, err := d.Readdirnames(maxListEntries + 1)
	if err != nil && err != io.EOF {
		return nil, false, err
	}
	truncated := len(names) > maxListEntries
	if truncated {
		names = names[:maxListEntries]
	}
	sort.Strings(names)
	entries := make([]FileInfo, 0, len(names))
	for _, n := range names {
		if st, err := os.Lstat(filepath.Join(p, n)); err == nil {
			fi := infoOf(filepath.Join(p, n), st)
			fi.Path = ""
			entries = append(entries, fi)
		}
	}
	return entries, truncated, nil
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeFile writes the body frames that follow the request into a new file beside p, renamed
// over p at the end: a write that fails half-way leaves the old file as it was. It answers
// failures itself; true when p is written.
func (s *Server) writeFile(c net.Conn, w *Writer, p string, req *FileRequest) bool {
	fail := func(err error) { _ = w.JSON(FrameError, fileFailure(err)) }
	// A new file is 0644; one that replaces a file keeps its mode unless one is given.
	mode := uint32(0o644)
	tmp := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".boxd-"+randomSuffix())
	var fh *os.File
	var err error
	direct := false
	blocking(func() {
		if st, e := os.Lstat(p); e == nil && st.Mode().IsRegular() {
			mode = unixMode(st.Mode())
		} else if e == nil && st.IsDir() {
			// A directory where a file is wanted: said before any byte is taken.
			err = &fs.PathError{Op: "write", Path: p, Err: syscall.EISDIR}
			return
		}
		if req.Parents {
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return
			}
		}
		// O_NOFOLLOW|O_EXCL: the temporary name is ours; private until its mode is set at the end.
		fh, err = os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err == nil {
			direct = writeDirectOnFuse(fh) // directio.go
		}
	})
	if err != nil {
		fail(err)
		return false
	}
	if req.Mode != nil {
		mode = *req.Mode
	}
	ok := false
	defer func() {
		if !ok {
			blocking(func() {
				_ = fh.Close()
				_ = os.Remove(tmp)
			})
		}
	}()
	// Writes of 512 KiB (a box root on FUSE pays a round trip to its daemon per write), while
	// the next block is taken off the socket. The body's frames are read through a buffer (a
	// few reads per block, not two per frame) straight into the blocks.
	br := bufio.NewReaderSize(c, fileWriteBuf)
	left := 0 // bytes of the current body frame still to read
	fillErr, writeErr := relay(fileWriteBuf, relayDepth, func(b []byte) (int, error) {
		n := 0
		for n < len(b) {
			if left == 0 {
				var hdr [5]byte
				if _, err := io.ReadFull(br, hdr[:]); err != nil {
					return n, errNodeGone
				}
				size := binary.BigEndian.Uint32(hdr[1:])
				switch {
				case size > MaxFrame:
					return n, failf("protocol", "", "frame too large")
				case hdr[0] == FrameStdinEOF && size == 0:
					return n, io.EOF
				case hdr[0] == FrameStdinEOF:
					return n, failf("protocol", "", "the end of a write carries no bytes")
				case hdr[0] != FrameStdin:
					return n, failf("protocol", "", "unexpected frame %q in a write", hdr[0])
				}
				left = int(size)
				continue
			}
			k := left
			if k > len(b)-n {
				k = len(b) - n
			}
			if _, err := io.ReadFull(br, b[n:n+k]); err != nil {
				return n, errNodeGone
			}
			n += k
			left -= k
		}
		return n, nil
	}, func(b []byte) (err error) {
		blocking(func() {
			var n int
			n, err = fh.Write(b)
			// A direct write the filesystem refuses (a FUSE daemon passing through to a file
			// with alignment rules): the rest is written buffered.
			if err != nil && direct && errors.Is(err, syscall.EINVAL) {
				direct = false
				if setDirect(fh, false) {
					_, err = fh.Write(b[n:])
				}
			}
		})
		return err
	})
	if writeErr != nil {
		fail(writeErr)
		return false
	}
	var pf *Failure
	if errors.As(fillErr, &pf) {
		_ = w.JSON(FrameError, pf)
		return false
	}
	if fillErr != nil {
		return false // the node went away: nothing is written
	}
	blocking(func() {
		if e := syscall.Fchmod(int(fh.Fd()), mode); e != nil { // exact, whatever the umask
			err = &fs.PathError{Op: "chmod", Path: p, Err: e}
			return
		}
		if err = fh.Close(); err != nil {
			return
		}
		if err = os.Rename(tmp, p); errors.Is(err, fs.ErrExist) { // Go's word for a directory there now
			err = &fs.PathError{Op: "write", Path: p, Err: syscall.EISDIR}
		}
	})
	if err != nil {
		fail(err)
		return false
	}
	ok = true
	return true
}
