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
# The first phase runs its files in name order (tap's). Two other orders were measured and were
# worse (2026-11-29, one dry run each, phase 1): name order 1174 s; longest first 1474 s (it put
# like files together: both crash files beside storage-zfs, all on zfs-fuse; scenarios beside
# pg-scenarios, two fork bombs of 4096 processes at once); storage-zfs first, then name order,
# 1335 s (storage-zfs beside the crash files again). Name order keeps each pg- copy away from
# its original; its cost is a tail: storage-zfs (4.4 min) starts near the end.
serial=()
parallel=()
for f in dist/test/*.test.js; do
  name=$(basename "$f" .test.js)
  if [[ "$f" == "$LAST" ]]; then continue; fi
  if [[ " ${SERIAL[*]} " == *" $name "* ]]; then serial+=("$f"); else parallel+=("$f"); fi
done
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
rc2=0
if (( ${#serial[@]} )); then "${TAP[@]}" --jobs=1 "${serial[@]}"; rc2=$?; fi
"${TAP[@]}" --jobs=1 "$LAST"
rc3=$?
if [ "$rc1" -ne 0 ]; then exit "$rc1"; fi
if [ "$rc2" -ne 0 ]; then exit "$rc2"; fi
exit "$rc3"
