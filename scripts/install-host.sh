#!/usr/bin/env bash
# Prepares a Debian 12 host (with Node and npm) to run boxhost: installs the host tools the
# workers drive and makes sure the ZFS daemon answers. Safe to run again: it only installs what
# is missing and only starts zfs-fuse when no ZFS answers. Run as root.
#
# Redis is installed but never started here: boxhost spawns its own redis-server on a unix
# socket in its data dir.
set -euo pipefail

# nftables: the CNI bridge plugin's macspoofchk and boxhost's per-box port chains run `nft`.
# libcap2-bin: getcap/setcap keep file capabilities when a base is shifted into an id range.
# golang-go: builds boxd, the agent every box runs as PID 1 (scripts/build-boxd.sh, no downloads).
# gcc, libc6-dev: the hardening tests build static probes (io_uring, raw sockets, seccomp, pidfd)
# to run inside boxes; without them those tests would be skipped.
PACKAGES=(redis-server runc zfs-fuse busybox-static tini golang-go containernetworking-plugins iptables iproute2 nftables libcap2-bin tmux curl mmdebstrap gcc libc6-dev)
ZFS_FUSE=/usr/sbin/zfs-fuse
ZFS_FUSE_PIDFILE=/var/run/zfs-fuse.pid
ZFS_WAIT_SECONDS=20

log() { printf 'install-host: %s\n' "$*"; }
die() { printf 'install-host: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian 12"
command -v dpkg-query >/dev/null || die "dpkg-query not found: this script supports Debian 12"

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done

if [ "${#missing[@]}" -gt 0 ]; then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Keep maintainer scripts from starting services (redis above all). A policy already in place
  # (as in containers) is left alone.
  temp_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    temp_policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$temp_policy"
    chmod 755 "$temp_policy"
    trap 'rm -f "$temp_policy"' EXIT
  fi
  apt_log=$(mktemp)
  if ! apt-get -q update >"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    die "apt-get update failed"
  fi
  if ! apt-get -q -y -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
      install "${missing[@]}" >>"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    die "apt-get install ${missing[*]} failed"
  fi
  rm -f "$apt_log"
  if [ -n "$temp_policy" ]; then
    rm -f "$temp_policy"
    trap - EXIT
  fi
  for pkg in "${missing[@]}"; do
    installed "$pkg" || die "$pkg is still not installed after apt-get install"
  done
else
  log "packages already installed: ${PACKAGES[*]}"
fi

# boxd asks for a 2 MiB send buffer on a file read's connection (boxd/files.go fileSendBuf); the
# kernel caps the ask at net.core.wmem_max (212992 on a default kernel) and then doubles it, so
# wmem_max is raised to 2 MiB here, never lowered: a 256 MiB download took ~25 % less time with
# 4 MiB in flight (docs/decisions.md "A read's connection holds 4 MiB in flight").
WMEM_MAX=2097152
wmem=$(cat /proc/sys/net/core/wmem_max 2>/dev/null || echo "")
if [ -n "$wmem" ] && [ "$wmem" -lt "$WMEM_MAX" ]; then
  if { echo "$WMEM_MAX" >/proc/sys/net/core/wmem_max; } 2>/dev/null; then
    log "net.core.wmem_max $wmem -> $WMEM_MAX"
    { [ -d /etc/sysctl.d ] && echo "net.core.wmem_max = $WMEM_MAX" >/etc/sysctl.d/60-boxhost.conf; } 2>/dev/null ||
      log "net.core.wmem_max: could not write /etc/sysctl.d/60-boxhost.conf; the value holds until reboot"
  else
    log "net.core.wmem_max stays $wmem (/proc/sys is not writable here): file downloads keep a smaller window"
  fi
fi

# A hung zfs-fuse never answers: every look gives up after 20 s.
zfs_answers() { timeout 20 zpool list -H >/dev/null 2>&1; }
# No pool imported and nothing of zfs-fuse mounted: a restart loses nothing.
zfs_idle() { [ -z "$(timeout 20 zpool list -H -o name 2>/dev/null)" ] && ! grep -q ' fuse.zfs ' /proc/self/mountinfo; }

# zfs-fuse's ARC holds ~256 KiB of pinned metadata per mounted filesystem in use, and a full ARC
# hangs the daemon for good: the 100 MB of Debian's zfsrc hung at ~390 box roots. zfs-fuse reads
# zfsrc when it starts, so it is raised here for every way the daemon starts (init script,
# systemd, this script, boxhost's watchdog, which also passes --max-arc-size).
# (BOXHOST_ZFS_FUSE_ARC_MB is read from this script's environment only, not from .env.)
ZFS_FUSE_ARC_MB=${BOXHOST_ZFS_FUSE_ARC_MB:-1024}
[[ "$ZFS_FUSE_ARC_MB" =~ ^[0-9]+$ ]] && [ "$ZFS_FUSE_ARC_MB" -ge 16 ] && [ "$ZFS_FUSE_ARC_MB" -le 16384 ] ||
  die "BOXHOST_ZFS_FUSE_ARC_MB=$ZFS_FUSE_ARC_MB: must be a whole number of MB from 16 to 16384"
ZFSRC=/etc/zfs/zfsrc
arc_raised=""
if [ -f "$ZFSRC" ]; then
  cur=$(sed -n 's/^[[:space:]]*max-arc-size[[:space:]]*=[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$ZFSRC" | tail -n 1)
  if [ -z "$cur" ] || [ "$cur" -lt "$ZFS_FUSE_ARC_MB" ]; then
    sed -i '/^[[:space:]]*max-arc-size[[:space:]]*=/d' "$ZFSRC"
    if [ -s "$ZFSRC" ] && [ -n "$(tail -c 1 "$ZFSRC")" ]; then echo >>"$ZFSRC"; fi
    echo "max-arc-size = $ZFS_FUSE_ARC_MB" >>"$ZFSRC"
    log "$ZFSRC: max-arc-size ${cur:-unset} -> $ZFS_FUSE_ARC_MB (MB)"
    arc_raised=yes
  fi
fi

# A running zfs-fuse that serves nothing is restarted when it should take a raised ARC cap, when
# it gives no answer (hung), or when asked: BOXHOST_FRESH_ZFS_FUSE=1 (scripts/test.sh, so a suite
# starts on a fresh daemon, not on one a whole session's work ran on: such a daemon has hung on
# its first `zfs create` of a new pool). One that serves pools is never restarted here.
if pgrep -x zfs-fuse >/dev/null; then
  if zfs_idle && { [ -n "$arc_raised" ] || [ "${BOXHOST_FRESH_ZFS_FUSE:-}" = 1 ] || ! zfs_answers; }; then
    if [ -n "$arc_raised" ]; then why="to take the new ARC cap"; elif [ "${BOXHOST_FRESH_ZFS_FUSE:-}" = 1 ]; then why="BOXHOST_FRESH_ZFS_FUSE=1"; else why="it gave no answer"; fi
    log "restarting the idle zfs-fuse ($why)"
    pkill -x zfs-fuse || true
    for _ in $(seq 1 100); do pgrep -x zfs-fuse >/dev/null || break; sleep 0.1; done
    if pgrep -x zfs-fuse >/dev/null; then
      pkill -KILL -x zfs-fuse || true
      for _ in $(seq 1 50); do pgrep -x zfs-fuse >/dev/null || break; sleep 0.1; done
      pgrep -x zfs-fuse >/dev/null && die "zfs-fuse did not stop (pid $(pgrep -x zfs-fuse | tr '\n' ' '))"
    fi
    rm -f "$ZFS_FUSE_PIDFILE"
  elif zfs_answers; then
    if [ -n "$arc_raised" ]; then log "zfs-fuse serves pools already: it keeps its old ARC cap until it restarts"; else log "ZFS answers (zpool list)"; fi
    exit 0
  else
    die "zfs-fuse serves pools but gives no answer to 'zpool list': a running node's storage watchdog restarts it, or kill it and run this again"
  fi
elif zfs_answers; then
  log "ZFS answers (zpool list)"
  exit 0
fi

[ -x "$ZFS_FUSE" ] || die "zpool does not answer and $ZFS_FUSE is missing"
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
[ -e /dev/fuse ] || die "/dev/fuse is missing: zfs-fuse needs the fuse kernel module"

log "starting zfs-fuse"
# zfs-fuse locks /var/lock/zfs/zfs_lock and exits 1 (said only to syslog) when /var/lock is gone.
mkdir -p "$(readlink -f /var/lock)/zfs"
started=""
if [ -d /run/systemd/system ]; then
  # restart: a unit whose daemon was killed above may still be "active" (RemainAfterExit).
  if systemctl restart zfs-fuse >/dev/null 2>&1 && pgrep -x zfs-fuse >/dev/null; then started=systemd; fi
fi
if [ -z "$started" ] && ! pgrep -x zfs-fuse >/dev/null; then
  # A pidfile left by a daemon that died makes zfs-fuse exit 1 without a word.
  if [ -f "$ZFS_FUSE_PIDFILE" ]; then
    pid=$(cat "$ZFS_FUSE_PIDFILE" 2>/dev/null || true)
    if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != zfs-fuse ]; then
      rm -f "$ZFS_FUSE_PIDFILE"
    fi
  fi
  # It daemonizes itself.
  "$ZFS_FUSE" --pidfile "$ZFS_FUSE_PIDFILE" --max-arc-size "$ZFS_FUSE_ARC_MB" || die "zfs-fuse failed to start (exit $?)"
fi

# A deadline, not a count of looks: one look of a daemon that hangs takes 20 s.
deadline=$((SECONDS + ZFS_WAIT_SECONDS))
while [ "$SECONDS" -lt "$deadline" ]; do
  if zfs_answers; then
    log "zfs-fuse is running; ZFS answers (zpool list)"
    exit 0
  fi
  sleep 0.1
done
die "zfs-fuse did not answer 'zpool list' within ${ZFS_WAIT_SECONDS}s"
