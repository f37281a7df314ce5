package main

import (
	"os"
	"os/signal"
	"testing"
	"time"
)

// A child that exits before the reaper's loop runs (a boot service that fails at once) is still
// reaped and its status delivered: the reaper subscribes to SIGCHLD when it is made and reaps
// once when its loop starts. With no timer to fall back on, a signal that came before the
// subscription would leave the child a zombie and its waiter waiting for ever.
func TestReaperTakesAChildThatEndedBeforeItsLoop(t *testing.T) {
	for i := 0; i < 20; i++ {
		r := NewReaper()
		_, status, err := r.Start(func() (int, error) {
			p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
			if err != nil {
				return 0, err
			}
			pid := p.Pid
			_ = p.Release()
			return pid, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the child has exited before the loop starts
		done := make(chan struct{})
		go func() {
			r.Run()
			close(done)
		}()
		select {
		case ws := <-status:
			if ws.ExitStatus() != 0 {
				t.Fatalf("exit status %d", ws.ExitStatus())
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("run %d: the child's status never came", i)
		}
		// This reaper ends before the next is made: a process has one reaper, and a loop left
		// running on a SIGCHLD still in its channel would wait4(-1) and take the next run's child
		// (its status lost: "the child's status never came", once in CI). Stop, then close, lets
		// the loop drain what is there and return.
		signal.Stop(r.sigs)
		close(r.sigs)
		<-done
	}
}
