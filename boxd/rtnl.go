package main

// A small rtnetlink client (links, addresses, routes) for the host helper's box networking
// (boxnet.go), and a way to run code inside a network namespace. Go's standard library frames
// netlink messages but has no requests of its own; only what boxnet.go needs is here.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
)

const (
	iflaNetNsFd   = 28
	iflaInfoKind  = 1
	iflaInfoData  = 2
	vethInfoPeer  = 1
	ifOperUp      = 6
	rtnlRecvLimit = 10 * time.Second
)

type rtnl struct {
	fd  int
	seq uint32
}

func openRtnl() (*rtnl, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.NETLINK_ROUTE)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("bind", err)
	}
	tv := syscall.NsecToTimeval(int64(rtnlRecvLimit))
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	return &rtnl{fd: fd, seq: uint32(time.Now().UnixNano())}, nil
}

func (c *rtnl) close() { syscall.Close(c.fd) }

// do sends one request and answers the messages of its reply: with ack, none (nil once the
// kernel acknowledged it); without, the one message it answered with.
func (c *rtnl) do(typ uint16, flags uint16, body []byte, ack bool) ([]syscall.NetlinkMessage, error) {
	c.seq++
	seq := c.seq
	if ack {
		flags |= syscall.NLM_F_ACK
	}
	msg := make([]byte, 16, 16+len(body))
	binary.LittleEndian.PutUint32(msg[0:4], uint32(16+len(body)))
	binary.LittleEndian.PutUint16(msg[4:6], typ)
	binary.LittleEndian.PutUint16(msg[6:8], flags|syscall.NLM_F_REQUEST)
	binary.LittleEndian.PutUint32(msg[8:12], seq)
	msg = append(msg, body...)
	if err := syscall.Sendto(c.fd, msg, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return nil, os.NewSyscallError("sendto", err)
	}
	buf := make([]byte, 1<<16)
	var out []syscall.NetlinkMessage
	for {
		n, _, err := syscall.Recvfrom(c.fd, buf, 0)
		if err != nil {
			return nil, os.NewSyscallError("recvfrom", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case syscall.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("short netlink error")
				}
				if code := int32(binary.LittleEndian.Uint32(m.Data[0:4])); code != 0 {
					return nil, syscall.Errno(-code)
				}
				return out, nil
			case syscall.NLMSG_DONE:
				return out, nil
			default:
				out = append(out, syscall.NetlinkMessage{Header: m.Header, Data: append([]byte(nil), m.Data...)})
				if !ack && m.Header.Flags&syscall.NLM_F_MULTI == 0 {
					return out, nil
				}
			}
		}
	}
}

func ifinfomsg(index int32, flags, change uint32) []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint32(b[4:8], uint32(index))
	binary.LittleEndian.PutUint32(b[8:12], flags)
	binary.LittleEndian.PutUint32(b[12:16], change)
	return b
}

func u32(v uint32) []byte {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, v)
	return b
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// link is what a link's RTM_NEWLINK says of it.
type link struct {
	index   int32
	name    string
	mac     []byte
	operUp  bool
	master  int32
	flagsUp bool
	hasLink bool
}

// getLink answers the link of that name (ENODEV when there is none).
func (c *rtnl) getLink(name string) (link, error) {
	msgs, err := c.do(syscall.RTM_GETLINK, 0, cat(ifinfomsg(0, 0, 0), nlAttr(syscall.IFLA_IFNAME, nlString(name))), false)
	if err != nil {
		return link{}, err
	}
	if len(msgs) == 0 || len(msgs[0].Data) < 16 {
		return link{}, fmt.Errorf("no answer for link %s", name)
	}
	d := msgs[0].Data
	l := link{index: int32(binary.LittleEndian.Uint32(d[4:8])), hasLink: true}
	l.flagsUp = binary.LittleEndian.Uint32(d[8:12])&syscall.IFF_UP != 0
	attrs, err := syscall.ParseNetlinkRouteAttr(&msgs[0])
	if err != nil {
		return link{}, err
	}
	for _, a := range attrs {
		switch a.Attr.Type {
		case syscall.IFLA_IFNAME:
			l.name = string(trimNul(a.Value))
		case syscall.IFLA_ADDRESS:
			l.mac = append([]byte(nil), a.Value...)
		case syscall.IFLA_OPERSTATE:
			l.operUp = len(a.Value) > 0 && a.Value[0] == ifOperUp
		case syscall.IFLA_MASTER:
			if len(a.Value) >= 4 {
				l.master = int32(binary.LittleEndian.Uint32(a.Value))
			}
		}
	}
	return l, nil
}

func trimNul(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

// setUp sets IFF_UP on a link.
func (c *rtnl) setUp(index int32) error {
	_, err := c.do(syscall.RTM_NEWLINK, 0, ifinfomsg(index, syscall.IFF_UP, syscall.IFF_UP), true)
	return err
}

// addAddr adds an IPv4 address (with its broadcast address, as the CNI plugins set it).
func (c *rtnl) addAddr(index int32, ip [4]byte, prefix int) error {
	body := []byte{syscall.AF_INET, byte(prefix), 0, 0}
	body = append(body, u32(uint32(index))...)
	body = append(body, nlAttr(syscall.IFA_LOCAL, ip[:])...)
	body = append(body, nlAttr(syscall.IFA_ADDRESS, ip[:])...)
	if prefix < 31 {
		var brd [4]byte
		v := binary.BigEndian.Uint32(ip[:]) | (1<<(32-uint(prefix)) - 1)
		binary.BigEndian.PutUint32(brd[:], v)
		body = append(body, nlAttr(syscall.IFA_BROADCAST, brd[:])...)
	}
	_, err := c.do(syscall.RTM_NEWADDR, syscall.NLM_F_CREATE|syscall.NLM_F_EXCL, body, true)
	return err
}

// addDefaultRoute adds `default via gw dev index` to the main table.
func (c *rtnl) addDefaultRoute(index int32, gw [4]byte) error {
	body := []byte{syscall.AF_INET, 0, 0, 0, syscall.RT_TABLE_MAIN, syscall.RTPROT_BOOT, syscall.RT_SCOPE_UNIVERSE, syscall.RTN_UNICAST}
	body = append(body, u32(0)...)
	body = append(body, nlAttr(syscall.RTA_GATEWAY, gw[:])...)
	body = append(body, nlAttr(syscall.RTA_OIF, u32(uint32(index)))...)
	_, err := c.do(syscall.RTM_NEWROUTE, syscall.NLM_F_CREATE|syscall.NLM_F_EXCL, body, true)
	return err
}

// inNetns runs fn on an OS thread that has joined the network namespace at path, then returns
// the thread to its own. A thread that cannot go back stays locked, and Go ends it with fn's
// goroutine: it never runs anything else.
func inNetns(path string, fn func() error) error {
	target, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(target)
	runtime.LockOSThread()
	origin, err := syscall.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", syscall.Gettid()), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return os.NewSyscallError("open own netns", err)
	}
	defer syscall.Close(origin)
	if _, _, e := syscall.RawSyscall(sysSetns, uintptr(target), syscall.CLONE_NEWNET, 0); e != 0 {
		runtime.UnlockOSThread()
		return &os.PathError{Op: "setns", Path: path, Err: e}
	}
	ferr := fn()
	if _, _, e := syscall.RawSyscall(sysSetns, uintptr(origin), syscall.CLONE_NEWNET, 0); e != 0 {
		return fmt.Errorf("returning from %s: %v (%v)", path, e, ferr)
	}
	runtime.UnlockOSThread()
	return ferr
}

// writeSysctl writes a value under /proc/sys, in the network namespace of the calling thread
// (net sysctls are per namespace); a missing one is not an error.
func writeSysctl(name, value string) error {
	f, err := os.OpenFile("/proc/sys/"+name, os.O_WRONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	_, err = f.WriteString(value)
	return err
}
