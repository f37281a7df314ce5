#!/usr/bin/env bash
# The suite (README: npm test), in two phases to keep it under its time goal on a 2-core host:
#   1. test files that share no host-wide state, three at a time (each test host has its own
#      data dir, pool, port, subnet and Redis). With two, the 2 cores sat idle 35-45% of this phase
#      (the files wait on zfs-fuse, runc and their boxes more than they compute): a full run took
#      21.4 min with two and 18.2 with three, every assertion passing (2026-11-28);
#   2. the files that do, one at a time: they fill the machine (scale, soak), measure what it
#      has room for (room), restart the shared zfs-fuse daemon (storage-watchdog), push a box to
#      its resource limits (hardening-box), make the debian base (mmdebstrap, dpkg and the
#      import keep a core and zfs-fuse busy for two minutes: run beside phase 1 as a third job it
#      slowed that phase by more than its own time alone, 2026-11-28), and last the check that
#      nothing was left behind.
# Each phase prints tap's totals; .ci/run adds them up. The exit code is the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
SERIAL=(debian room hardening-box storage-watchdog soak-short scale)
# The check that nothing was left runs alone, after both phases (tap orders the files of one run
# as it likes: in one run it ran storage-watchdog after it).
LAST=dist/test/zz-leftovers.test.js
# The first phase starts storage-zfs first, then the rest in name order. tap runs its files in
# name order, and the 4-minute storage-zfs started near the end and ran on alone while the other
# jobs had finished (phase 1 took 1174 s for 1022 s of work per job, 2026-11-29). Starting every
# file longest first was tried and was worse (1474 s, its files' times summing 800 s more): it put
# the likes together (the two crash files beside storage-zfs, all on zfs-fuse; scenarios beside
# pg-scenarios, two fork bombs of 4096 processes at once), which the alphabet keeps apart. tap
# sorts the files it is given by name, so the phase is given them as links in dist/test-order/
# named by rank (node runs a link's target, whose own directory its requires resolve from).
FIRST=(storage-zfs)
serial=()
parallel=()
rest=()
for f in dist/test/*.test.js; do
  name=$(basename "$f" .test.js)
  if [[ "$f" == "$LAST" ]]; then continue; fi
  if [[ " ${SERIAL[*]} " == *" $name "* ]]; then serial+=("$f"); elif [[ " ${FIRST[*]} " != *" $name "* ]]; then rest+=("$f"); fi
done
rm -rf dist/test-order && mkdir -p dist/test-order
rank=0
link() { rank=$((rank + 1)); local l; l=$(printf 'dist/test-order/%03d-%s' "$rank" "$(basename "$1")"); ln -s "../test/$(basename "$1")" "$l"; parallel+=("$l"); }
for name in "${FIRST[@]}"; do
  if [[ -f "dist/test/$name.test.js" ]]; then link "dist/test/$name.test.js"; fi
done
for f in "${rest[@]}"; do link "$f"; done
# The suite starts on a fresh zfs-fuse when the machine's serves nothing (scripts/install-host.sh
# says why); it also makes sure the host tools are there.
BOXHOST_FRESH_ZFS_FUSE=1 bash scripts/install-host.sh || exit 1
# What the suite's leftovers check finds before any test ran is not this run's (a machine that
# ran an earlier suite killed mid-way, something the sweep could not remove): it is recorded
# here and reported, not failed, by test/zz-leftovers.test.ts.
if [ -z "${BOXHOST_LEFTOVERS_BEFORE:-}" ]; then
  BOXHOST_LEFTOVERS_BEFORE=$(mktemp -t leftovers-before.XXXXXX)
  trap 'rm -f "$BOXHOST_LEFTOVERS_BEFORE"' EXIT
fi
export BOXHOST_LEFTOVERS_BEFORE
node -e "require('./dist/test/helpers/leftovers').leftoversOf({}).then((l) => require('fs').writeFileSync(process.env.BOXHOST_LEFTOVERS_BEFORE, JSON.stringify(l)))"
# tap runs each file with its plugins' import hooks; package.json turns off the two the suite has
# no use for (@tapjs/typescript: the files are compiled JavaScript; @tapjs/mock): the TypeScript
# hook alone cost each file's process ~1.1 s of CPU, and a file 2.1 s of wall time in all, 0.5 s
# without them (≈80 files on 2 cores). tap rebuilds its runner for that plugin set at its first
# run after npm ci (≈10 s, once).
# Test hosts run inside the test files' processes: a thread pool as large as a node's
# (server/threadpool.ts says why), set before each process starts.
export UV_THREADPOOL_SIZE="${UV_THREADPOOL_SIZE:-64}"
TAP=(npx tap --disable-coverage --timeout=900)
"${TAP[@]}" --jobs="${BOXHOST_TEST_JOBS:-3}" "${parallel[@]}"
rc1=$?
"${TAP[@]}" --jobs=1 "${serial[@]}"
rc2=$?
"${TAP[@]}" --jobs=1 "$LAST"
rc3=$?
if [ "$rc1" -ne 0 ]; then exit "$rc1"; fi
if [ "$rc2" -ne 0 ]; then exit "$rc2"; fi
exit "$rc3"
