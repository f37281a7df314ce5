package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Off FUSE (the test's temporary directory is ext4 or tmpfs), a file keeps buffered writes:
// O_DIRECT has alignment rules there that boxd's last block would break.
func TestWriteDirectOnFuseLeavesOtherFilesystemsBuffered(t *testing.T) {
	fh, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(fh.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if uint32(st.Type) == fuseSuperMagic {
		t.Skip("the temporary directory is on FUSE")
	}
	if writeDirectOnFuse(fh) {
		t.Fatal("O_DIRECT turned on off FUSE")
	}
	fl, err := fcntl(fh.Fd(), syscall.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fl&syscall.O_DIRECT != 0 {
		t.Fatalf("flags %o carry O_DIRECT", fl)
	}
	if _, err := fh.Write([]byte("odd length")); err != nil {
		t.Fatal(err)
	}
}

// A direct write refused later turns O_DIRECT off again: setDirect takes the flag both ways.
func TestSetDirectBothWays(t *testing.T) {
	fh, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	flags := func() int {
		fl, err := fcntl(fh.Fd(), syscall.F_GETFL, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fl
	}
	if !setDirect(fh, true) {
		t.Skip("this filesystem takes no O_DIRECT")
	}
	if flags()&syscall.O_DIRECT == 0 {
		t.Fatal("O_DIRECT did not take")
	}
	if !setDirect(fh, false) {
		t.Fatal("O_DIRECT could not be turned off")
	}
	if fl := flags(); fl&syscall.O_DIRECT != 0 {
		t.Fatalf("flags %o still carry O_DIRECT", fl)
	}
	if _, err := fh.Write([]byte("odd length")); err != nil {
		t.Fatal(err)
	}
}
