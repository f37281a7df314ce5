package main

// Host side, before a box's first start: its user namespace and the network namespace that
// belongs to it, made in one program (docs/boxd.md "Host modes"; the node's
// workers/runtime/userns.ts calls it).
//
//	boxd netns USERNS_FILE NETNS_FILE HOST_ID SIZE
//
// starts a holder (`cat`) in a new user namespace mapping 0..SIZE-1 to HOST_ID.. for both uids
// and gids, and a new network namespace inside it, brings that netns's loopback interface up
// from the host side, bind-mounts the holder's two namespaces onto the given files (something
// mounted there already is detached first, so the new one replaces it rather than stacking on
// it), then lets the holder go. Once bound, the namespaces live on without any process in them.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"unsafe"
)

func hostNetns(args []string) int { return hostNetnsTo(args, os.Stderr) }

// hostNetnsTo is `boxd netns`, its complaints written to stderr: the spawner runs it in its own
// process for a node's `boxd netns` command (spawner.go), sparing a program start per create.
func hostNetnsTo(args []string, out io.Writer) int {
	// The holder's stderr is copied in by exec's goroutine while fail writes here too.
	stderr := &lockedWriter{w: out}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "boxd netns: "+format+"\n", a...)
		return 1
	}
	if len(args) != 4 {
		fmt.Fprintln(stderr, "usage: boxd netns USERNS_FILE NETNS_FILE HOST_ID SIZE")
		return 2
	}
	usernsFile, netnsFile := args[0], args[1]
	hostID, err1 := strconv.Atoi(args[2])
	size, err2 := strconv.Atoi(args[3])
	if err1 != nil || err2 != nil || hostID <= 0 || size <= 0 {
		return fail("HOST_ID and SIZE must be positive integers")
	}
	idMap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostID, Size: size}}
	// The holder only has to exist, in its new namespaces, until they are bound: `cat` on a pipe
	// (a small C program; a Go one cost ≈15 ms of CPU to start here). It is root of the new
	// namespaces (unmapped host root would be nobody there); the host side brings its lo up.
	prog, holderArgs := holderProgram()
	holder := exec.Command(prog, holderArgs...)
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: idMap,
		GidMappings: idMap,
		// Left allowed: the box's processes join this user namespace, and setgroups(2) is how
		// su, login and package managers drop to their users.
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
		Pdeathsig:                  syscall.SIGKILL,
	}
	holder.Stderr = stderr
	stdin, err := holder.StdinPipe()
	if err != nil {
		return fail("%v", err)
	}
	// Its namespaces exist once Start returns (the maps are written before it may exec).
	if err := holder.Start(); err != nil {
		return fail("starting the holder: %v", err)
	}
	defer func() {
		_ = stdin.Close()
		_ = holder.Process.Kill()
		_ = holder.Wait()
	}()
	ns := func(kind string) string { return fmt.Sprintf("/proc/%d/ns/%s", holder.Process.Pid, kind) }
	if err := inNetns(ns("net"), loopbackUp); err != nil {
		return fail("loopback up: %v", err)
	}
	for _, b := range []struct{ kind, target string }{{"user", usernsFile}, {"net", netnsFile}} {
		// EINVAL: nothing mounted there (or not a mount's root), which is the usual case.
		if err := syscall.Unmount(b.target, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fail("unmounting %s: %v", b.target, err)
		}
		if err := syscall.Mount(ns(b.kind), b.target, "", syscall.MS_BIND, ""); err != nil {
			return fail("binding the %s namespace onto %s: %v", b.kind, b.target, err)
		}
	}
	return 0
}

// holderProgram is a program that waits for its stdin to end: cat, where the host has it,
// else busybox's cat, else this program's own `netns-hold`.
func holderProgram() (string, []string) {
	for _, p := range []string{"/bin/cat", "/usr/bin/cat"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if _, err := os.Stat("/bin/busybox"); err == nil {
		return "/bin/busybox", []string{"cat"}
	}
	return "/proc/self/exe", []string{"netns-hold"}
}

// lockedWriter lets two goroutines write one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// netnsHold waits for its stdin to close (the holder on a host without cat).
func netnsHold() int {
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// loopbackUp sets IFF_UP on lo (SIOCGIFFLAGS, then SIOCSIFFLAGS), as the CNI loopback plugin
// does.
func loopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	var req struct {
		name  [syscall.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(req.name[:], "lo")
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCGIFFLAGS, uintptr(unsafe.Pointer(&req))); e != 0 {
		return e
	}
	req.flags |= syscall.IFF_UP | syscall.IFF_RUNNING
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&req))); e != 0 {
		return e
	}
	return nil
}
