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
PACKAGES=(redis-server runc zfs-fuse busybox-static tini containernetworking-plugins iptables iproute2 nftables libcap2-bin)
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

zfs_answers() { zpool list -H >/dev/null 2>&1; }

if zfs_answers; then
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
if [ -d /run/systemd/system ] && systemctl start zfs-fuse >/dev/null 2>&1; then
  started=systemd
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
  "$ZFS_FUSE" --pidfile "$ZFS_FUSE_PIDFILE" || die "zfs-fuse failed to start (exit $?)"
fi

for _ in $(seq 1 $((ZFS_WAIT_SECONDS * 10))); do
  if zfs_answers; then
    log "zfs-fuse is running; ZFS answers (zpool list)"
    exit 0
  fi
  sleep 0.1
done
die "zfs-fuse did not answer 'zpool list' within ${ZFS_WAIT_SECONDS}s"
