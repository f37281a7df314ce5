package main

// Host side, before a box's first start: its user namespace and the network namespace that
// belongs to it, made in one program (docs/boxd.md "Host modes"; the node's
// workers/runtime/userns.ts calls it).
//
//	boxd netns USERNS_FILE NETNS_FILE HOST_ID SIZE
//
// starts a holder (this binary, `netns-hold`) in a new user namespace mapping 0..SIZE-1 to
// HOST_ID.. for both uids and gids, and a new network namespace inside it. The holder brings
// the loopback interface up (it is root of the namespace it owns), says so, and waits. The
// parent bind-mounts the holder's two namespaces onto the given files (something mounted
// there already is detached first, so the new one replaces it rather than stacking on it),
// then lets the holder go. Once bound, the namespaces live on without any process in them.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"unsafe"
)

func hostNetns(args []string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "boxd netns: "+format+"\n", a...)
		return 1
	}
	if len(args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: boxd netns USERNS_FILE NETNS_FILE HOST_ID SIZE")
		return 2
	}
	usernsFile, netnsFile := args[0], args[1]
	hostID, err1 := strconv.Atoi(args[2])
	size, err2 := strconv.Atoi(args[3])
	if err1 != nil || err2 != nil || hostID <= 0 || size <= 0 {
		return fail("HOST_ID and SIZE must be positive integers")
	}
	idMap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostID, Size: size}}
	// The holder execs this binary through /proc/self/exe: as the new namespace's root it is an
	// unprivileged host user, who may not be able to walk to the binary's own path (a clone
	// under /root, 0700); the magic link needs no walk.
	holder := exec.Command("/proc/self/exe", "netns-hold")
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: idMap,
		GidMappings: idMap,
		// Left allowed: the box's processes join this user namespace, and setgroups(2) is how
		// su, login and package managers drop to their users.
		GidMappingsEnableSetgroups: true,
		// Root of the new namespaces (unmapped host root would be nobody there, without
		// capabilities over the netns it owns).
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
		Pdeathsig:  syscall.SIGKILL,
	}
	holder.Stderr = os.Stderr
	stdin, err := holder.StdinPipe()
	if err != nil {
		return fail("%v", err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		return fail("%v", err)
	}
	if err := holder.Start(); err != nil {
		return fail("starting the holder: %v", err)
	}
	defer func() {
		_ = stdin.Close()
		_ = holder.Process.Kill()
		_ = holder.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		return fail("the holder did not get ready (%q, %v)", line, err)
	}
	for _, b := range []struct{ kind, target string }{{"user", usernsFile}, {"net", netnsFile}} {
		// EINVAL: nothing mounted there (or not a mount's root), which is the usual case.
		if err := syscall.Unmount(b.target, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fail("unmounting %s: %v", b.target, err)
		}
		src := fmt.Sprintf("/proc/%d/ns/%s", holder.Process.Pid, b.kind)
		if err := syscall.Mount(src, b.target, "", syscall.MS_BIND, ""); err != nil {
			return fail("binding the %s namespace onto %s: %v", b.kind, b.target, err)
		}
	}
	return 0
}

// netnsHold is the holder: in its new namespaces, loopback up, "ready", then it waits for its
// stdin to close.
func netnsHold() int {
	if err := loopbackUp(); err != nil {
		fmt.Fprintf(os.Stderr, "boxd netns: loopback up: %v\n", err)
		return 1
	}
	if _, err := os.Stdout.WriteString("ready\n"); err != nil {
		return 1
	}
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
