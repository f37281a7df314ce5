package main

// Users and the box's environment file, read inside the box (its /etc, its symlinks).

import (
	"bufio"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// maxAccountsFile bounds what is read of /etc/passwd, /etc/group and /etc/boxes-env.
const maxAccountsFile = 1 << 20

// Account is a user resolved in the box.
type Account struct {
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary, besides GID
	Home   string
	Shell  string
}

var userNameRE = regexp.MustCompile(`^[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?$`)

func readLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(io.LimitReader(f, maxAccountsFile))
	sc.Buffer(make([]byte, 64<<10), maxAccountsFile)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func parseID(s string) (uint32, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > maxID {
		return 0, false
	}
	return uint32(n), true
}

// lookupUser resolves `NAME`, `NAME:GROUP`, `UID` or `UID:GID` in the box's /etc/passwd and
// /etc/group, and checks the ids against the box's user namespace (an id it does not map
// cannot be switched to). An empty spec is root.
func lookupUser(spec string) (*Account, *Failure) {
	if spec == "" {
		return &Account{Home: homeOf(0), Shell: "/bin/sh"}, nil
	}
	u, g, hasGroup := strings.Cut(spec, ":")
	if u == "" || (hasGroup && (g == "" || strings.Contains(g, ":"))) {
		return nil, failf("input", "user", "invalid user %q", spec)
	}
	uNum, uIsNum := parseID(u)
	if !uIsNum && !userNameRE.MatchString(u) {
		return nil, failf("input", "user", "invalid user %q", spec)
	}
	acct := &Account{UID: uNum, Home: "/", Shell: "/bin/sh"}
	var name string
	found := false
	for _, line := range readLines("/etc/passwd") {
		f := strings.Split(line, ":")
		if len(f) < 4 || f[0] == "" {
			continue
		}
		id, ok1 := parseID(f[2])
		gid, ok2 := parseID(f[3])
		if !ok1 || !ok2 {
			continue
		}
		if (uIsNum && id == uNum) || (!uIsNum && f[0] == u) {
			name, found = f[0], true
			acct.UID, acct.GID = id, gid
			if len(f) >= 6 && f[5] != "" {
				acct.Home = f[5]
			}
			if len(f) >= 7 && f[6] != "" {
				acct.Shell = f[6]
			}
			break
		}
	}
	if !found && !uIsNum {
		return nil, failf("input", "user", "unknown user %q in the box", u)
	}
	groups := readLines("/etc/group")
	if hasGroup {
		if gNum, ok := parseID(g); ok {
			acct.GID = gNum
		} else {
			ok := false
			for _, line := range groups {
				f := strings.Split(line, ":")
				if len(f) >= 3 && f[0] == g {
					if id, isID := parseID(f[2]); isID {
						acct.GID, ok = id, true
						break
					}
				}
			}
			if !ok {
				return nil, failf("input", "user", "unknown group %q in the box", g)
			}
		}
	}
	if found && !(uIsNum && hasGroup) {
		seen := map[uint32]bool{acct.GID: true}
		for _, line := range groups {
			f := strings.Split(line, ":")
			if len(f) < 4 {
				continue
			}
			id, ok := parseID(f[2])
			if !ok || seen[id] {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if strings.TrimSpace(m) == name {
					seen[id] = true
					acct.Groups = append(acct.Groups, id)
					break
				}
			}
		}
	}
	if !found {
		acct.Home = homeOf(acct.UID)
	}
	if lim := idLimit(); lim > 0 {
		for _, id := range append([]uint32{acct.UID, acct.GID}, acct.Groups...) {
			if uint64(id) >= lim {
				return nil, failf("input", "user", "user %s is not an id of the box (0…%d)", spec, lim-1)
			}
		}
	}
	return acct, nil
}

// idLimit is how many ids from 0 the box's user namespace maps (0: no namespace of its own, or
// unknown): an id at or past it cannot be switched to.
func idLimit() uint64 {
	lines := readLines("/proc/self/uid_map")
	if len(lines) != 1 {
		return 0
	}
	f := strings.Fields(lines[0])
	if len(f) != 3 || f[0] != "0" {
		return 0
	}
	outside, err1 := strconv.ParseUint(f[1], 10, 32)
	n, err2 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil || (outside == 0 && n == 1<<32-1) {
		return 0 // the identity map: the host's own namespace
	}
	return n
}

// boxEnv reads /etc/boxes-env: `KEY='value'` entries as the node writes them (values
// shell-quoted with single quotes, a `'\”` inside standing for a quote; a quoted value may span
// lines). An entry it cannot read is skipped.
func boxEnv() []string {
	f, err := os.Open("/etc/boxes-env")
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxAccountsFile))
	if err != nil {
		return nil
	}
	return parseBoxEnv(string(b))
}

func parseBoxEnv(s string) []string {
	var out []string
	for len(s) > 0 {
		eq := strings.IndexAny(s, "=\n")
		if eq < 0 || s[eq] == '\n' {
			if eq < 0 {
				break
			}
			s = s[eq+1:]
			continue
		}
		key := s[:eq]
		val, rest, ok := shellWord(s[eq+1:])
		s = rest
		if ok && key != "" && !strings.ContainsAny(key, " \t'\"") {
			out = append(out, key+"="+val)
		}
	}
	return out
}

// shellWord reads one word of single-quoted parts (which may hold newlines), backslash-escaped
// characters and plain characters, up to an unquoted newline; it answers the word and what
// follows the newline.
func shellWord(s string) (string, string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\n':
			return b.String(), s[i+1:], true
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return "", "", false
			}
			b.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case '\\':
			if i+1 >= len(s) {
				return "", "", false
			}
			b.WriteByte(s[i+1])
			i++
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), "", true
}
