package main

import "testing"

func TestMountOptionsAt(t *testing.T) {
	info := []byte("22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n" +
		"90 29 0:45 / /var/tmp/pool/by-range/100000/boxes/b1 rw,relatime shared:50 - fuse zfs rw\n" +
		"91 29 0:46 / /var/tmp/my\\040pool/b2 rw,noatime shared:51 - fuse zfs rw\n" +
		"92 90 0:45 / /var/tmp/pool/by-range/100000/boxes/b1 rw,nosuid,nodev,relatime shared:50 - fuse zfs rw\n")
	if got := mountOptionsAt(info, "/var/tmp/pool/by-range/100000/boxes/b1"); !got["nosuid"] || !got["nodev"] {
		t.Fatalf("the last mount at a point is the one in effect: %v", got)
	}
	if got := mountOptionsAt(info, "/var/tmp/my pool/b2"); got == nil || !got["noatime"] || got["nosuid"] {
		t.Fatalf("an escaped space in the mount point: %v", got)
	}
	if got := mountOptionsAt(info, "/var/tmp/pool/by-range/100000/boxes"); got != nil {
		t.Fatalf("a directory that is no mount point: %v", got)
	}
	// Fields are split at spaces only: a no-break space (U+00A0), which the kernel does not
	// escape, stays inside its field.
	nbsp := []byte("93 29 0:47 / /var/tmp/a\u00a0b rw,relatime shared:52 - fuse zfs rw\n" +
		"94 29 0:48 /x\u00a0/y,nosuid,nodev /var/tmp/c rw,relatime shared:53 - fuse zfs rw\n")
	if got := mountOptionsAt(nbsp, "/var/tmp/a\u00a0b"); got == nil || got["nosuid"] {
		t.Fatalf("a mount point with a no-break space: %v", got)
	}
	if got := mountOptionsAt(nbsp, "/var/tmp/c"); got == nil || got["nosuid"] || got["nodev"] {
		t.Fatalf("a root field with a no-break space shifts no field: %v", got)
	}
	if got := mountOptionsAt(info, "/"); got != nil {
		t.Fatalf("a root field is not the mount point: %v", got)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/a\134b`: `/a\b`, `/a\011`: "/a\t", `/plain`: "/plain", `/end\04`: `/end\04`} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}
