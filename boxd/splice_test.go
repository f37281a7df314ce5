package main

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// unixPair is a connected unix stream pair as net.Conns (boxd's end first), as the node's
// listening socket hands boxd its connections.
func unixPair(t *testing.T) (net.Conn, net.Conn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// readFrames reads frames from c until it closes: their payloads joined, and how many there were.
func readFrames(t *testing.T, c net.Conn) ([]byte, int) {
	var got bytes.Buffer
	n := 0
	for {
		f, err := ReadFrame(c)
		if err == io.EOF {
			return got.Bytes(), n
		}
		if err != nil {
			t.Errorf("reading frames: %v", err)
			_, _ = io.Copy(io.Discard, c) // the sender is not left blocked on a full socket
			return got.Bytes(), n
		}
		if f.Type != FrameData {
			t.Errorf("frame %q, want data frames only", f.Type)
		}
		got.Write(f.Payload)
		n++
	}
}

func TestSpliceDataSendsTheFileAsFrames(t *testing.T) {
	for _, size := range []int{0, 1, 64<<10 - 1, 3<<20 + 12345} {
		want := make([]byte, size)
		_, _ = rand.Read(want)
		p := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(p, want, 0o600); err != nil {
			t.Fatal(err)
		}
		fh, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		boxdEnd, nodeEnd := unixPair(t)
		type out struct {
			b []byte
			n int
		}
		done := make(chan out)
		go func() {
			b, n := readFrames(t, nodeEnd)
			done <- out{b, n}
		}()
		fillErr, sendErr := spliceData(fh, boxdEnd, &Writer{w: boxdEnd}, 256<<10)
		boxdEnd.Close()
		got := <-done
		fh.Close()
		nodeEnd.Close()
		if fillErr != nil || sendErr != nil {
			t.Fatalf("size %d: fillErr %v, sendErr %v", size, fillErr, sendErr)
		}
		if !bytes.Equal(got.b, want) {
			t.Fatalf("size %d: got %d bytes, not the file's", size, len(got.b))
		}
		if max := (size + 256<<10 - 1) / (256 << 10); got.n > 4*max+1 {
			t.Errorf("size %d: %d frames, blocks of 256 KiB make about %d", size, got.n, max)
		}
	}
}

// A file the kernel cannot splice (most of /proc) sends nothing and says so: the caller copies.
func TestSpliceDataRefusesWhatCannotBeSpliced(t *testing.T) {
	fh, err := os.Open("/proc/self/stat")
	if err != nil {
		t.Skip(err)
	}
	defer fh.Close()
	boxdEnd, nodeEnd := unixPair(t)
	defer nodeEnd.Close()
	// Nothing waits on the node's end: the refusal must come before any byte is sent.
	fillErr, sendErr := spliceData(fh, boxdEnd, &Writer{w: boxdEnd}, 64<<10)
	boxdEnd.Close()
	if fillErr == nil && sendErr == nil {
		t.Skip("this kernel splices /proc/self/stat")
	}
	if fillErr != errNoSplice || sendErr != nil {
		t.Fatalf("fillErr %v, sendErr %v; want errNoSplice", fillErr, sendErr)
	}
	if b, _ := io.ReadAll(nodeEnd); len(b) != 0 {
		t.Fatalf("%d bytes sent before the refusal", len(b))
	}
}

// A node that went away mid-file is the send's failure, not the file's.
func TestSpliceDataNodeGone(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	boxdEnd, nodeEnd := unixPair(t)
	nodeEnd.Close()
	fillErr, sendErr := spliceData(fh, boxdEnd, &Writer{w: boxdEnd}, 256<<10)
	boxdEnd.Close()
	if fillErr != nil || sendErr == nil {
		t.Fatalf("fillErr %v, sendErr %v; want a send error only", fillErr, sendErr)
	}
}
