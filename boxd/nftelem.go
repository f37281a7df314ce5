package main

// Set elements of an nftables table, added or deleted over netlink by the long-lived host
// helper (`boxd spawner`, op "nft-elements"): a box's port guard is three elements of the node's
// port table (workers/network/portGuard.ts), and an `nft` process to add them cost ≈45 ms of CPU
// on the build machine, most of it the program's start and its cache of the ruleset, for what is
// one netlink batch. Keys come ready-made from the node (each field padded to 4 bytes, as nft
// lays out a concatenation); this file only frames them.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

const (
	nfnlSubsysNftables  = 10
	nftMsgNewSetElem    = 12
	nftMsgDelSetElem    = 14
	nfnlMsgBatchBegin   = 0x10
	nfnlMsgBatchEnd     = 0x11
	nftaSetElemListTbl  = 1
	nftaSetElemListSet  = 2
	nftaSetElemListElts = 3
	nftaListElem        = 1
	nftaSetElemKey      = 1
	nftaDataValue       = 1
	nlaFNested          = 0x8000
	netlinkNetfilter    = 12
)

// nftElementsRequest: add (or delete) these keys of these sets of family/table, all in one
// transaction (every set's elements or none).
type nftElementsRequest struct {
	Family uint8        `json:"family"`
	Table  string       `json:"table"`
	Sets   []nftSetKeys `json:"sets"`
	Delete bool         `json:"delete,omitempty"`
}

type nftSetKeys struct {
	Set  string   `json:"set"`
	Keys [][]byte `json:"keys"`
}

func nlAttr(typ uint16, data []byte) []byte {
	n := 4 + len(data)
	b := make([]byte, (n+3)&^3)
	binary.LittleEndian.PutUint16(b[0:2], uint16(n))
	binary.LittleEndian.PutUint16(b[2:4], typ)
	copy(b[4:], data)
	return b
}

func nlString(s string) []byte { return append([]byte(s), 0) }

func nlMessage(typ, flags uint16, seq uint32, family uint8, resID uint16, attrs ...[]byte) []byte {
	body := []byte{family, 0, byte(resID >> 8), byte(resID)} // nfgenmsg, res_id big-endian
	for _, a := range attrs {
		body = append(body, a...)
	}
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h[0:4], uint32(16+len(body)))
	binary.LittleEndian.PutUint16(h[4:6], typ)
	binary.LittleEndian.PutUint16(h[6:8], flags)
	binary.LittleEndian.PutUint32(h[8:12], seq)
	return append(h, body...)
}

// nftElements applies the request as one nf_tables batch and waits for the kernel's answer.
func nftElements(req nftElementsRequest) error {
	if req.Table == "" || len(req.Sets) == 0 {
		return errors.New("nft-elements: a table and sets are required")
	}
	msgs := make([][]byte, 0, len(req.Sets))
	for _, set := range req.Sets {
		if set.Set == "" || len(set.Keys) == 0 {
			return errors.New("nft-elements: each set needs a name and keys")
		}
		var elems []byte
		for _, k := range set.Keys {
			if len(k) == 0 || len(k) > 64 {
				return fmt.Errorf("nft-elements: a key of %d bytes", len(k))
			}
			key := nlAttr(nftaSetElemKey|nlaFNested, nlAttr(nftaDataValue, k))
			elems = append(elems, nlAttr(nftaListElem|nlaFNested, key)...)
		}
		msgs = append(msgs, elems)
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, netlinkNetfilter)
	if err != nil {
		return os.NewSyscallError("socket", err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return os.NewSyscallError("bind", err)
	}
	tv := syscall.NsecToTimeval(int64(10 * time.Second))
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	seq := uint32(time.Now().UnixNano())
	msgType, flags := uint16(nfnlSubsysNftables<<8|nftMsgNewSetElem), uint16(syscall.NLM_F_REQUEST|syscall.NLM_F_CREATE|syscall.NLM_F_ACK)
	if req.Delete {
		msgType, flags = uint16(nfnlSubsysNftables<<8|nftMsgDelSetElem), uint16(syscall.NLM_F_REQUEST|syscall.NLM_F_ACK)
	}
	var batch []byte
	batch = append(batch, nlMessage(nfnlMsgBatchBegin, syscall.NLM_F_REQUEST, seq, syscall.AF_UNSPEC, nfnlSubsysNftables)...)
	for i, elems := range msgs {
		batch = append(batch, nlMessage(msgType, flags, seq+1+uint32(i), req.Family, 0,
			nlAttr(nftaSetElemListTbl, nlString(req.Table)),
			nlAttr(nftaSetElemListSet, nlString(req.Sets[i].Set)),
			nlAttr(nftaSetElemListElts|nlaFNested, elems))...)
	}
	last := seq + uint32(len(msgs))
	batch = append(batch, nlMessage(nfnlMsgBatchEnd, syscall.NLM_F_REQUEST, last+1, syscall.AF_UNSPEC, nfnlSubsysNftables)...)
	if err := syscall.Sendto(fd, batch, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return os.NewSyscallError("sendto", err)
	}
	buf := make([]byte, 1<<16)
	for {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil {
			return os.NewSyscallError("recvfrom", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != syscall.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			code := int32(binary.LittleEndian.Uint32(m.Data[0:4]))
			if code != 0 {
				return syscall.Errno(-code)
			}
			if m.Header.Seq == last {
				return nil // the ack of the last elements message: the batch is committed
			}
		}
	}
}
