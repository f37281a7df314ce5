package main

// A box's network, done by the node's host helper (`boxd spawner`, op "box-net") over netlink
// instead of by the CNI `bridge` and `host-local` plugins (workers/network/cni.ts keeps them as
// its fallback). The result is the same as theirs, on the same files:
//
//   - the project bridge (made when missing, up, its gateway address, its MAC pinned so that it
//     does not follow its ports, IPv4 forwarding on), as the bridge plugin with isGateway;
//   - a veth pair made from the host with its peer born as eth0 in the box's netns, the host end
//     named veth<8 hex>, on the bridge, both up;
//   - an address from the project's range, leased as host-local leases it (a file named by the
//     address in <ipam dir>/<network>/ holding "<container id>\r\n<ifname>", round robin from
//     last_reserved_ip.0, under flock of <dir>/lock), so either side can release it;
//   - in the netns: arp_notify on, DAD off, the address with its broadcast, the default route.
//
// Two plugin programs cost ≈60 ms of CPU a create on the build machine; this is a few syscalls.

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type boxNetRequest struct {
	Delete bool `json:"delete,omitempty"`
	// The box's netns (a bind-mounted nsfs file) and CNI container id.
	Netns       string `json:"netns"`
	ContainerID string `json:"containerId"`
	IfName      string `json:"ifname"`
	Bridge      string `json:"bridge"`
	// <ipam dir>/<network name>: host-local's lease directory for the project's network.
	LeaseDir   string `json:"leaseDir"`
	Subnet     string `json:"subnet"`
	Gateway    string `json:"gateway"`
	RangeStart string `json:"rangeStart"`
	RangeEnd   string `json:"rangeEnd"`
}

type boxNetResult struct {
	Address  string `json:"address"`
	Gateway  string `json:"gateway"`
	HostVeth string `json:"hostVeth"`
	Mac      string `json:"mac"`
}

const leaseLineBreak = "\r\n"

func boxNet(req boxNetRequest) ([]byte, error) {
	if req.Netns == "" || req.ContainerID == "" || req.IfName == "" || req.LeaseDir == "" {
		return nil, errors.New("box-net: netns, containerId, ifname and leaseDir are required")
	}
	if req.Delete {
		return []byte("{}"), boxNetDel(req)
	}
	res, err := boxNetAdd(req)
	if err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

func ipv4Of(s string) ([4]byte, error) {
	var out [4]byte
	ip := net.ParseIP(s).To4()
	if ip == nil {
		return out, fmt.Errorf("not an IPv4 address: %q", s)
	}
	copy(out[:], ip)
	return out, nil
}

func boxNetAdd(req boxNetRequest) (*boxNetResult, error) {
	_, subnet, err := net.ParseCIDR(req.Subnet)
	if err != nil || subnet.IP.To4() == nil {
		return nil, fmt.Errorf("box-net: bad subnet %q", req.Subnet)
	}
	prefix, _ := subnet.Mask.Size()
	gw, err := ipv4Of(req.Gateway)
	if err != nil {
		return nil, err
	}
	start, err1 := ipv4Of(req.RangeStart)
	end, err2 := ipv4Of(req.RangeEnd)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("box-net: bad range %s-%s", req.RangeStart, req.RangeEnd)
	}
	host, err := openRtnl()
	if err != nil {
		return nil, err
	}
	defer host.close()
	br, err := ensureBridge(host, req.Bridge, gw, prefix)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", req.Bridge, err)
	}
	addr, err := leaseAddress(req.LeaseDir, req.ContainerID, req.IfName, start, end, gw, req.Subnet)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = releaseLease(req.LeaseDir, req.ContainerID, req.IfName)
		}
	}()
	veth, err := makeVeth(host, br.index, req.Netns, req.IfName)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			if l, err := host.getLink(veth); err == nil {
				_, _ = host.do(syscall.RTM_DELLINK, 0, ifinfomsg(l.index, 0, 0), true)
			}
		}
	}()
	var mac []byte
	err = inNetns(req.Netns, func() error {
		c, err := openRtnl()
		if err != nil {
			return err
		}
		defer c.close()
		l, err := c.getLink(req.IfName)
		if err != nil {
			return fmt.Errorf("%s in the netns: %w", req.IfName, err)
		}
		mac = l.mac
		_ = writeSysctl("net/ipv6/conf/"+req.IfName+"/accept_dad", "0")
		_ = writeSysctl("net/ipv4/conf/"+req.IfName+"/arp_notify", "1")
		if !l.flagsUp {
			if err := c.setUp(l.index); err != nil {
				return fmt.Errorf("%s up: %w", req.IfName, err)
			}
		}
		if err := c.addAddr(l.index, addr, prefix); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("address on %s: %w", req.IfName, err)
		}
		if err := c.addDefaultRoute(l.index, gw); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("default route: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The host end is forwarding once the pair has a carrier (as the bridge plugin waits).
	for i, wait := range []time.Duration{0, 5, 20, 50, 100, 500, 1000, 1000} {
		time.Sleep(wait * time.Millisecond)
		l, err := host.getLink(veth)
		if err != nil {
			return nil, err
		}
		if l.operUp {
			break
		}
		if i == 7 {
			return nil, fmt.Errorf("bridge port %s is not up", veth)
		}
	}
	ok = true
	return &boxNetResult{
		Address:  fmt.Sprintf("%s/%d", net.IP(addr[:]).String(), prefix),
		Gateway:  net.IP(gw[:]).String(),
		HostVeth: veth,
		Mac:      net.HardwareAddr(mac).String(),
	}, nil
}

// ensureBridge makes the bridge when missing, and answers it up with its gateway address.
func ensureBridge(c *rtnl, name string, gw [4]byte, prefix int) (link, error) {
	if len(name) == 0 || len(name) > 15 {
		return link{}, fmt.Errorf("bad bridge name %q", name)
	}
	br, err := c.getLink(name)
	if errors.Is(err, syscall.ENODEV) {
		info := nlAttr(syscall.IFLA_LINKINFO|nlaFNested, nlAttr(iflaInfoKind, []byte("bridge")))
		_, err = c.do(syscall.RTM_NEWLINK, syscall.NLM_F_CREATE|syscall.NLM_F_EXCL, cat(ifinfomsg(0, 0, 0), nlAttr(syscall.IFLA_IFNAME, nlString(name)), info), true)
		if err != nil && !errors.Is(err, syscall.EEXIST) {
			return link{}, err
		}
		br, err = c.getLink(name)
	}
	if err != nil {
		return link{}, err
	}
	if !br.flagsUp {
		_ = writeSysctl("net/ipv6/conf/"+name+"/accept_ra", "0")
		if err := c.setUp(br.index); err != nil {
			return link{}, err
		}
	}
	switch err := c.addAddr(br.index, gw, prefix); {
	case err == nil:
		// Its MAC set to itself: else a bridge takes its lowest port's, which changes as boxes
		// come and go (and every box's ARP entry for the gateway goes stale).
		if len(br.mac) == 6 {
			if _, err := c.do(syscall.RTM_NEWLINK, 0, cat(ifinfomsg(br.index, 0, 0), nlAttr(syscall.IFLA_ADDRESS, br.mac)), true); err != nil {
				return link{}, fmt.Errorf("pinning its MAC: %w", err)
			}
		}
	case errors.Is(err, syscall.EEXIST):
	default:
		return link{}, fmt.Errorf("gateway address: %w", err)
	}
	if cur, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(string(cur)) != "1" {
		if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
			return link{}, err
		}
	}
	return br, nil
}

// makeVeth makes the pair from the host: the host end (a fresh veth<8 hex> name) on the bridge
// and up, its peer born as ifname in the netns (down). Answers the host end's name.
func makeVeth(c *rtnl, bridge int32, netnsPath, ifname string) (string, error) {
	nsfd, err := syscall.Open(netnsPath, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", &os.PathError{Op: "open", Path: netnsPath, Err: err}
	}
	defer syscall.Close(nsfd)
	for try := 0; ; try++ {
		var rnd [4]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return "", err
		}
		name := "veth" + hex.EncodeToString(rnd[:])
		// The peer is brought up from inside the netns: veth refuses to open one end before the
		// pair is linked (ENOTCONN), which is when the kernel would apply a peer's flags.
		peer := cat(ifinfomsg(0, 0, 0), nlAttr(syscall.IFLA_IFNAME, nlString(ifname)), nlAttr(iflaNetNsFd, u32(uint32(nsfd))))
		info := nlAttr(syscall.IFLA_LINKINFO|nlaFNested, cat(nlAttr(iflaInfoKind, []byte("veth")), nlAttr(iflaInfoData|nlaFNested, nlAttr(vethInfoPeer|nlaFNested, peer))))
		body := cat(ifinfomsg(0, syscall.IFF_UP, syscall.IFF_UP), nlAttr(syscall.IFLA_IFNAME, nlString(name)), nlAttr(syscall.IFLA_MASTER, u32(uint32(bridge))), info)
		_, err := c.do(syscall.RTM_NEWLINK, syscall.NLM_F_CREATE|syscall.NLM_F_EXCL, body, true)
		if err == nil {
			return name, nil
		}
		// A name taken on the host (the peer's name in the netns is EEXIST too: not retried).
		if errors.Is(err, syscall.EEXIST) && try < 3 {
			if _, e := c.getLink(name); e == nil {
				continue
			}
		}
		return "", fmt.Errorf("veth pair: %w", err)
	}
}

func boxNetDel(req boxNetRequest) error {
	// The pair goes with its end in the netns. No netns (or a file that is no netns any more,
	// after a reboot): nothing is wired, only the lease is left to free.
	err := inNetns(req.Netns, func() error {
		c, err := openRtnl()
		if err != nil {
			return err
		}
		defer c.close()
		l, err := c.getLink(req.IfName)
		if errors.Is(err, syscall.ENODEV) {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := c.do(syscall.RTM_DELLINK, 0, ifinfomsg(l.index, 0, 0), true); err != nil && !errors.Is(err, syscall.ENODEV) {
			return err
		}
		return nil
	})
	var pe *os.PathError
	if err != nil && !(errors.As(err, &pe) && (errors.Is(pe.Err, syscall.ENOENT) || errors.Is(pe.Err, syscall.EINVAL))) {
		return err
	}
	return releaseLease(req.LeaseDir, req.ContainerID, req.IfName)
}

// withLeaseLock runs fn holding host-local's lock of the lease directory.
func withLeaseLock(dir string, fn func() error) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return fn()
}

// leaseAddress leases the next free address of [start, end] after the last one leased (round
// robin, the gateway skipped), as host-local does; one the container already holds is refused.
func leaseAddress(dir, cid, ifname string, start, end, gw [4]byte, subnet string) ([4]byte, error) {
	var got [4]byte
	err := withLeaseLock(dir, func() error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		key := strings.TrimSpace(cid) + leaseLineBreak + ifname
		for _, e := range entries {
			if net.ParseIP(e.Name()) == nil {
				continue
			}
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err == nil && (strings.TrimSpace(string(data)) == key || strings.TrimSpace(string(data)) == strings.TrimSpace(cid)) {
				return fmt.Errorf("%s has been allocated to %s, duplicate allocation is not allowed", e.Name(), cid)
			}
		}
		lo, hi := binary.BigEndian.Uint32(start[:]), binary.BigEndian.Uint32(end[:])
		if hi < lo {
			return fmt.Errorf("bad range %v-%v", net.IP(start[:]), net.IP(end[:]))
		}
		cur := lo
		if last, err := os.ReadFile(filepath.Join(dir, "last_reserved_ip.0")); err == nil {
			if ip := net.ParseIP(strings.TrimSpace(string(last))).To4(); ip != nil {
				if v := binary.BigEndian.Uint32(ip); v >= lo && v <= hi {
					cur = v + 1
					if v == hi {
						cur = lo
					}
				}
			}
		}
		g := binary.BigEndian.Uint32(gw[:])
		for n := uint32(0); n <= hi-lo; n++ {
			v := lo + (cur-lo+n)%(hi-lo+1)
			if v == g {
				continue
			}
			var ip [4]byte
			binary.BigEndian.PutUint32(ip[:], v)
			name := net.IP(ip[:]).String()
			f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_EXCL|os.O_CREATE, 0o644)
			if errors.Is(err, os.ErrExist) {
				continue
			}
			if err != nil {
				return err
			}
			_, werr := f.WriteString(key)
			cerr := f.Close()
			if werr != nil || cerr != nil {
				_ = os.Remove(filepath.Join(dir, name))
				return fmt.Errorf("writing lease %s: %v %v", name, werr, cerr)
			}
			if err := os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte(name), 0o644); err != nil {
				return err
			}
			got = ip
			return nil
		}
		return fmt.Errorf("no IP addresses available in range set: %s-%s", net.IP(start[:]), net.IP(end[:]))
	})
	return got, err
}

// releaseLease frees whatever the container holds in the directory (host-local's DEL).
func releaseLease(dir, cid, ifname string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return withLeaseLock(dir, func() error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		key := []byte(strings.TrimSpace(cid) + leaseLineBreak + ifname)
		old := []byte(strings.TrimSpace(cid))
		for _, e := range entries {
			if net.ParseIP(e.Name()) == nil {
				continue
			}
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				continue
			}
			if d := bytes.TrimSpace(data); bytes.Equal(d, key) || bytes.Equal(d, old) {
				_ = os.Remove(filepath.Join(dir, e.Name()))
			}
		}
		return nil
	})
}
