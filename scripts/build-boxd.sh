#!/usr/bin/env bash
# Builds boxd, the static agent every box runs as PID 1 (boxd/, Go standard library only), into
# dist/boxd/boxd. Go comes from Debian's golang-go (scripts/install-host.sh); nothing is
# downloaded: GOPROXY=off, and the module has no requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null || { echo "build-boxd: go not found: run scripts/install-host.sh (it installs golang-go)" >&2; exit 1; }
mkdir -p dist/boxd
export CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local
export GOCACHE=${GOCACHE:-$PWD/.cache/go-build} GOPATH=${GOPATH:-$PWD/.cache/go}
(cd boxd && go build -trimpath -ldflags='-s -w' -o ../dist/boxd/boxd.tmp .)
chmod 0755 dist/boxd/boxd.tmp
mv -f dist/boxd/boxd.tmp dist/boxd/boxd
