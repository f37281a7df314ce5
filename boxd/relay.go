package main

import "io"

// relay moves a stream from fill to drain through depth buffers of size bytes, the two sides
// at work at once: a file read from a FUSE root while the previous block goes out on the
// node's socket, or an upload taken off the socket while the previous block is written. Alone
// in one loop, each side waited for the other (a download or upload through boxd took about
// the sum of the two, measured; docs/decisions.md "Files at stream speed").
//
// fill returns how much of its buffer it filled and io.EOF at the end (with or after the last
// bytes); any other error ends the relay as fillErr. A drain error ends it as drainErr. When
// relay returns, fill may still be running on its last buffer (a read of a socket that the
// caller's close ends); it is never called again.
func relay(size, depth int, fill func([]byte) (int, error), drain func([]byte) error) (fillErr, drainErr error) {
	type block struct {
		b   []byte
		err error
	}
	free := make(chan []byte, depth)
	for i := 0; i < depth; i++ {
		free <- make([]byte, size)
	}
	full := make(chan block, depth)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			var b []byte
			select {
			case b = <-free:
			case <-stop:
				return
			}
			n, err := fill(b)
			select {
			case full <- block{b[:n], err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		blk := <-full
		if len(blk.b) > 0 {
			if err := drain(blk.b); err != nil {
				return nil, err
			}
		}
		if blk.err == io.EOF {
			return nil, nil
		}
		if blk.err != nil {
			return blk.err, nil
		}
		free <- blk.b[:cap(blk.b)]
	}
}
