import fs from 'node:fs';
import t from 'tap';
import { run } from '../core/command';
import { leftoversOf } from './helpers/leftovers';

/**
 * Runs last (scripts/test.sh ends its serial phase with it): the suite claims that no pool,
 * dataset, container, cgroup, netns, user namespace, bridge, veth, firewall chain, mount,
 * embedded redis-server, data dir or PostgreSQL schema of any test is left on the machine.
 * Here that claim is checked with the host tools, after a positive control shows the check
 * sees what it looks for.
 */
t.test('the check finds a leftover when there is one (positive control)', async (t) => {
  const tag = 'f0f0f0';
  const ns = `bh${tag}-control`;
  await run(['ip', 'netns', 'add', ns]);
  t.teardown(() => run(['ip', 'netns', 'del', ns], { allowFailure: true }));
  t.ok((await leftoversOf({ hostTag: tag })).includes(`netns ${ns}`), 'a tagged netns is reported');
  t.ok((await leftoversOf({})).includes(`netns ${ns}`), 'by the whole-suite check too');
  await run(['ip', 'netns', 'del', ns]);
  t.notOk((await leftoversOf({ hostTag: tag })).includes(`netns ${ns}`), 'and no longer once removed');
});

/** What was there before this run's first test (scripts/test.sh records it): not this run's. */
function before(): Set<string> {
  const file = process.env.BOXHOST_LEFTOVERS_BEFORE;
  if (!file || !fs.existsSync(file)) return new Set();
  const text = fs.readFileSync(file, 'utf8').trim();
  return new Set(text ? (JSON.parse(text) as string[]) : []);
}

t.test('nothing of the suite is left on the machine', async (t) => {
  const earlier = before();
  const all = await leftoversOf({});
  const left = all.filter((l) => !earlier.has(l));
  const old = all.filter((l) => earlier.has(l));
  if (old.length) t.comment(`there before this run began (not counted):\n${old.join('\n')}`);
  t.same(left, [], `left behind:\n${left.join('\n')}`);
  t.ok(fs.existsSync('/run'), 'the check looked at a real host');
});
