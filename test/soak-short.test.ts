import t from 'tap';
import { DEFAULT_OPTIONS, runSoak } from '../soak/soak';
import { formatSummary } from '../soak/report';

/**
 * The soak (`npm run soak`, soak/soak.ts) with small numbers, so CI runs the same code: two
 * rounds of 30 box lifecycles on a real host (creates, execs, forks, stops, resumes, deletes
 * through the API, keepers exec'd into during the deletes), then no unfinished or failed
 * operation, every box where it should be, nothing of any box left on the machine, /healthz 200.
 */
t.test('short soak: 2 rounds × 30 boxes end clean', async (t) => {
  const result = await runSoak({
    ...DEFAULT_OPTIONS,
    rounds: 2,
    boxesPerRound: 30,
    keepers: 2,
    // Every kind of step still happens in 30 boxes (forks of running and of stopped sources,
    // stops with and without resume, the provoked failures).
    opBoundS: 180,
    seed: 13,
    progress: (msg) => t.comment(msg),
  });
  t.comment(formatSummary(result));
  t.equal(result.error, null, 'the soak ran to the end');
  t.equal(result.rounds.length, 2, 'both rounds ran');
  for (const r of result.rounds) {
    t.equal(r.counts.boxes, 30, `round ${r.round}: 30 boxes`);
    t.ok((r.counts.forks ?? 0) >= 3, `round ${r.round}: forks made`);
    t.equal(r.counts.deletes, r.counts.boxes + r.counts.forks, `round ${r.round}: every box and fork deleted`);
    t.ok(r.provoked['exec exit 7'] > 0 && r.provoked['exec in a stopped box (409)'] > 0 && r.provoked['create of a taken name (409)'] === 1, `round ${r.round}: the provoked failures happened, and were answered as expected`);
    t.same(r.errors, {}, `round ${r.round}: no unexpected error`);
  }
  t.equal(result.final.keepers_deleted, 2, 'keepers deleted at the end');
  t.same(result.final.leftovers, {}, 'no dataset, container, netns, userns, mount, veth, nft chain, cgroup or lease left');
  t.same(result.final.leftovers_unchecked, [], 'every leftover check ran');
  t.equal(result.final.healthz.status, 200, '/healthz 200 at the end');
  t.same(result.failures, [], 'no failed check');
  t.same(result.cleanup_problems, [], 'clean teardown');
});
