// boxd is the PID 1 of every box: it reaps zombies, keeps the box alive, and serves its node
// (exec, with or without a terminal) over a listening socket the node made on the host side and
// handed in as fd 3. It never listens on the box's network. See docs/boxd.md.
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

// Version is boxd's own version, told in the hello.
var Version = "1.3.2"

const listenFD = 3

func main() {
	if len(os.Args) > 1 && os.Args[1] == "listen" {
		// Host side, before runc: make the socket, then become runc with it as fd 3.
		os.Exit(hostListen(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "netns" {
		// Host side, before a box's first start: its user and network namespaces (netns.go).
		os.Exit(hostNetns(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "netns-hold" {
		os.Exit(netnsHold())
	}
	if len(os.Args) > 1 && os.Args[1] == "spawner" {
		// Host side: the node's host commands, started without a fork of the node (spawner.go).
		os.Exit(hostSpawner())
	}
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(Version)
		return
	}
	if len(os.Args) > 1 {
		// An unknown mode (a helper asked of an older boxd, say) must not become a box's agent on
		// the host: it says so and ends.
		fmt.Fprintf(os.Stderr, "boxd: unknown mode %q (usage: boxd [listen|netns|netns-hold|spawner|version])\n", os.Args[1])
		os.Exit(2)
	}
	serve()
}

func serve() {
	// Nothing in the box may ptrace PID 1, read its memory or take its descriptors through
	// /proc/1/fd (those checks want CAP_SYS_PTRACE for a non-dumpable process).
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0)
	// Its threads, made now while the box has pids to spare (threads.go).
	runtime.GOMAXPROCS(serveProcs)
	keepThreads(spareThreads)
	// Signals from inside the box do nothing to PID 1 (the kernel drops SIGKILL and SIGSTOP
	// from inside; every other one is caught here and dropped). The node stops a box over the
	// socket. Caught, not ignored: an ignored signal would stay ignored in every process boxd
	// starts, while a caught one is back to its default after exec.
	reaper := NewReaper()
	go reaper.Run()
	sup := NewSupervisor(reaper)
	go sup.Boot()
	dropped := make(chan os.Signal, 64)
	signal.Notify(dropped)
	go func() {
		for range dropped {
		}
	}()

	f := os.NewFile(listenFD, "boxd-listener")
	var ln net.Listener
	if f != nil {
		l, err := net.FileListener(f) // a duplicate, close-on-exec
		_ = f.Close()
		if err == nil {
			ln = l
		} else {
			fmt.Fprintf(os.Stderr, "boxd: no listening socket on fd %d: %v\n", listenFD, err)
		}
	}
	if ln == nil {
		// No node can reach this box; it stays up (reaping) until it is stopped.
		select {}
	}
	s := &Server{reaper: reaper, sup: sup}
	for {
		c, err := ln.Accept()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.handle(c)
	}
}

// hostListen: `boxd listen SOCKET PROGRAM ARGS...` binds and listens on the unix socket SOCKET
// (replacing what is there), puts it on fd 3 and execs PROGRAM.
func hostListen(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: boxd listen SOCKET PROGRAM [ARGS...]")
		return 2
	}
	sock, prog := args[0], args[1]
	f, err := listeningSocket(sock) // as the spawner makes it (spawner.go)
	if err != nil {
		fmt.Fprintf(os.Stderr, "boxd listen: %v\n", err)
		return 1
	}
	// On fd 3, open across the exec (dup3 without O_CLOEXEC; the original is close-on-exec).
	if fd := int(f.Fd()); fd == listenFD {
		_, _, e := syscall.RawSyscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_SETFD, 0)
		if e != 0 {
			fmt.Fprintf(os.Stderr, "boxd listen: fcntl: %v\n", e)
			return 1
		}
	} else if err := syscall.Dup3(fd, listenFD, 0); err != nil {
		fmt.Fprintf(os.Stderr, "boxd listen: dup: %v\n", err)
		return 1
	}
	err = syscall.Exec(prog, args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "boxd listen: exec %s: %v\n", prog, err)
	return 1
}
