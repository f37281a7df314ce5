package main

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func threadCount(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Threads:") {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "Threads:")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads: line")
	return 0
}

// The threads keepThreads makes are there after it returns, idle, for later calls.
func TestKeepThreadsLeavesThemIdle(t *testing.T) {
	before := threadCount(t)
	want := before + 20
	keepThreads(want)
	if got := threadCount(t); got < want {
		t.Fatalf("%d threads after keepThreads(%d) (%d before)", got, want, before)
	}
	time.Sleep(100 * time.Millisecond)
	if got := threadCount(t); got < want {
		t.Fatalf("%d threads a moment later: the runtime ended some", got)
	}
}

// blocking lets maxBlocking calls in at once, and the rest in turn.
func TestBlockingBoundsCallsInside(t *testing.T) {
	var mu sync.Mutex
	inside, peak := 0, 0
	var wg sync.WaitGroup
	for i := 0; i < 5*maxBlocking; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			blocking(func() {
				mu.Lock()
				inside++
				if inside > peak {
					peak = inside
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
				mu.Lock()
				inside--
				mu.Unlock()
			})
		}()
	}
	wg.Wait()
	if peak != maxBlocking {
		t.Fatalf("at most %d calls at once, %d seen", maxBlocking, peak)
	}
}

// openRegular never waits on a FIFO (whose open waits for a writer) and gives regular files in
// blocking mode.
func TestOpenRegularRefusesFIFOWithoutWaiting(t *testing.T) {
	dir := t.TempDir()
	fifo := dir + "/fifo"
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		f, err := openRegular(fifo, syscall.O_RDONLY, true)
		if f != nil {
			_ = f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != errNotRegular {
			t.Fatalf("a FIFO: %v, want errNotRegular", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("openRegular waited on a FIFO with no writer")
	}
	file := dir + "/file"
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := openRegular(file, syscall.O_RDONLY, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flags, _, e := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), syscall.F_GETFL, 0)
	if e != 0 || flags&syscall.O_NONBLOCK != 0 {
		t.Fatalf("a regular file left non-blocking (flags %#x, %v)", flags, e)
	}
	if _, err := openRegular(dir, syscall.O_RDONLY, false); err != errNotRegular {
		t.Fatalf("a directory where none is taken: %v", err)
	}
	if _, err := openRegular(dir+"/none", syscall.O_RDONLY, true); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
}
