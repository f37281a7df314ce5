#!/usr/bin/env bash
# The suite (README: npm test), in two phases to keep it under its time goal on a 2-core host:
#   1. test files that share no host-wide state, two at a time (each test host has its own data
#      dir, pool, port, subnet and Redis);
#   2. the files that do, one at a time: they fill the machine (scale, soak), measure what it
#      has room for (room), restart the shared zfs-fuse daemon (storage-watchdog), push a box to
#      its resource limits (hardening-box), and last the check that nothing was left behind.
# Beside phase 1, in a tap run of its own: the debian base test, which spends most of its two
# minutes waiting on Debian's package mirror (about half of one core busy; mmdebstrap --mode=root
# works in the host's mount namespace, so it holds no other test's mounts). As a third job it
# costs phase 1 far less than its own time alone.
# Each run prints tap's totals; .ci/run adds them up. The exit code is the first failing phase's
# (phase 1 before the debian run beside it).
set -uo pipefail
cd "$(dirname "$0")/.."
SERIAL=(room hardening-box storage-watchdog soak-short scale)
BESIDE=(debian)
# The check that nothing was left runs alone, after both phases (tap orders the files of one run
# as it likes: in one run it ran storage-watchdog after it).
LAST=dist/test/zz-leftovers.test.js
serial=()
parallel=()
for f in dist/test/*.test.js; do
  name=$(basename "$f" .test.js)
  if [[ "$f" == "$LAST" || " ${BESIDE[*]} " == *" $name "* ]]; then continue; fi
  if [[ " ${SERIAL[*]} " == *" $name "* ]]; then serial+=("$f"); else parallel+=("$f"); fi
done
# The suite starts on a fresh zfs-fuse when the machine's serves nothing (scripts/install-host.sh
# says why); it also makes sure the host tools are there.
BOXHOST_FRESH_ZFS_FUSE=1 bash scripts/install-host.sh || exit 1
temps=()
beside=
beside_log=
# A run ended early takes its background tap run with it (npx, tap and the test file's process,
# children first), then prints what that run wrote. It stays in this script's process group, so
# whatever kills the group kills it too.
kill_tree() {
  local c
  for c in $(pgrep -P "$1"); do kill_tree "$c"; done
  kill -TERM "$1" 2>/dev/null
}
trap 'if [ -n "$beside" ]; then kill_tree "$beside"; wait "$beside"; cat "$beside_log"; fi; rm -f "${temps[@]}"' EXIT
# What the suite's leftovers check finds before any test ran is not this run's (a machine that
# ran an earlier suite killed mid-way, something the sweep could not remove): it is recorded
# here and reported, not failed, by test/zz-leftovers.test.ts.
if [ -z "${BOXHOST_LEFTOVERS_BEFORE:-}" ]; then
  BOXHOST_LEFTOVERS_BEFORE=$(mktemp -t leftovers-before.XXXXXX)
  temps+=("$BOXHOST_LEFTOVERS_BEFORE")
fi
export BOXHOST_LEFTOVERS_BEFORE
node -e "require('./dist/test/helpers/leftovers').leftoversOf({}).then((l) => require('fs').writeFileSync(process.env.BOXHOST_LEFTOVERS_BEFORE, JSON.stringify(l)))"
# Test hosts run inside the test files' processes: a thread pool as large as a node's
# (server/threadpool.ts says why), set before each process starts.
export UV_THREADPOOL_SIZE="${UV_THREADPOOL_SIZE:-64}"
TAP=(npx tap --disable-coverage --timeout=900)
beside_log=$(mktemp -t beside.XXXXXX)
temps+=("$beside_log")
besides=()
for name in "${BESIDE[@]}"; do besides+=("dist/test/$name.test.js"); done
"${TAP[@]}" --jobs=1 "${besides[@]}" >"$beside_log" 2>&1 &
beside=$!
"${TAP[@]}" --jobs="${BOXHOST_TEST_JOBS:-2}" "${parallel[@]}"
rc1=$?
wait "$beside"
rc0=$?
beside=
cat "$beside_log"
"${TAP[@]}" --jobs=1 "${serial[@]}"
rc2=$?
"${TAP[@]}" --jobs=1 "$LAST"
rc3=$?
if [ "$rc1" -ne 0 ]; then exit "$rc1"; fi
if [ "$rc0" -ne 0 ]; then exit "$rc0"; fi
if [ "$rc2" -ne 0 ]; then exit "$rc2"; fi
exit "$rc3"
