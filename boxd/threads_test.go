package main

import (
	"os"
	"strconv"
	"strings"
	"sync"
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
