/**
 * The box state machine of core/box.ts as tables: the expected answers are written out here,
 * not derived from TRANSITIONS, so a change to the machine shows up as a failing row.
 */
import t from 'tap';
import { allowed, BOX_STATUSES, BoxAction, BoxStatus, canExec, canFork, canSnapshot, canUpdate, projectedStatus, Repair, repairFor, TRANSITIONAL, TRANSITIONS } from '../core/box';

const STATUSES: BoxStatus[] = ['creating', 'running', 'stopping', 'stopped', 'resuming', 'restoring', 'deleting', 'failed'];
const ACTIONS: BoxAction[] = ['create', 'stop', 'resume', 'restore', 'delete'];

t.test('the transitions and the status lists', async (t) => {
  t.same(TRANSITIONS, {
    create: { from: [], during: 'creating', after: 'running' },
    stop: { from: ['running'], during: 'stopping', after: 'stopped' },
    resume: { from: ['stopped', 'failed'], during: 'resuming', after: 'running' },
    restore: { from: ['running', 'stopped'], during: 'restoring', after: 'running' },
    delete: { from: ['running', 'stopped', 'failed'], during: 'deleting', after: 'gone' },
  });
  t.same([...TRANSITIONAL].sort(), ['creating', 'deleting', 'restoring', 'resuming', 'stopping']);
  t.same([...BOX_STATUSES].sort(), [...STATUSES, 'unknown'].sort(), 'every stored status, plus unknown');
  for (const a of ACTIONS) t.ok(TRANSITIONAL.has(TRANSITIONS[a].during), `${a} shows a transitional status while it runs`);
});

t.test('projectedStatus runs the queued actions in order', async (t) => {
  const cases: [BoxStatus, BoxAction[], BoxStatus][] = [
    ['running', [], 'running'],
    ['failed', [], 'failed'],
    ['creating', ['create'], 'running'],
    ['running', ['stop'], 'stopped'],
    ['stopping', ['stop'], 'stopped'],
    ['running', ['stop', 'resume'], 'running'],
    ['running', ['stop', 'resume', 'stop'], 'stopped'],
    ['running', ['stop', 'resume', 'delete'], 'deleting'],
    ['stopped', ['delete'], 'deleting'],
    ['failed', ['delete'], 'deleting'],
    ['creating', ['create', 'delete'], 'deleting'],
    ['stopped', ['restore'], 'running'],
    ['restoring', ['restore', 'stop'], 'stopped'],
  ];
  for (const [current, pending, expected] of cases) {
    t.equal(projectedStatus(current, pending), expected, `${current} + [${pending.join(', ')}] → ${expected}`);
  }
});

t.test('every action from every status, nothing queued', async (t) => {
  const allowedFrom: Record<BoxStatus, BoxAction[]> = {
    creating: [],
    running: ['stop', 'restore', 'delete'],
    stopping: [],
    stopped: ['resume', 'restore', 'delete'],
    resuming: [],
    restoring: [],
    deleting: [],
    failed: ['resume', 'delete'],
  };
  for (const status of STATUSES) {
    for (const action of ACTIONS) {
      t.equal(allowed(action, status, []), allowedFrom[status].includes(action), `${action} from ${status}`);
    }
  }
});

t.test('actions queued behind others are judged on the projected status', async (t) => {
  const cases: [BoxStatus, BoxAction[], BoxAction[]][] = [
    // [current, pending, the actions allowed next]
    ['creating', ['create'], ['stop', 'restore', 'delete']],
    ['running', ['stop'], ['resume', 'restore', 'delete']],
    ['stopping', ['stop'], ['resume', 'restore', 'delete']],
    ['running', ['stop', 'resume'], ['stop', 'restore', 'delete']],
    ['stopped', ['resume'], ['stop', 'restore', 'delete']],
    ['stopped', ['restore'], ['stop', 'restore', 'delete']],
    ['running', ['stop', 'resume', 'delete'], []],
    ['running', ['delete'], []],
    ['failed', ['delete'], []],
    ['failed', ['resume'], ['stop', 'restore', 'delete']],
  ];
  for (const [current, pending, next] of cases) {
    for (const action of ACTIONS) {
      t.equal(allowed(action, current, pending), next.includes(action), `${action} after ${current} + [${pending.join(', ')}]`);
    }
  }
});

t.test('a queued delete refuses everything after it, from any status', async (t) => {
  for (const status of STATUSES) {
    for (const before of [[], ['stop'], ['stop', 'resume']] as BoxAction[][]) {
      const pending: BoxAction[] = [...before, 'delete'];
      t.same(
        ACTIONS.filter((a) => allowed(a, status, pending)),
        [],
        `nothing after ${status} + [${pending.join(', ')}]`,
      );
    }
  }
});

t.test('exec, fork, snapshot and update by status', async (t) => {
  const table: Record<BoxStatus, { exec: boolean; fork: boolean; snapshot: boolean; update: boolean }> = {
    creating: { exec: false, fork: false, snapshot: false, update: true },
    running: { exec: true, fork: true, snapshot: true, update: true },
    stopping: { exec: false, fork: false, snapshot: false, update: true },
    stopped: { exec: false, fork: true, snapshot: true, update: true },
    resuming: { exec: false, fork: false, snapshot: false, update: true },
    restoring: { exec: false, fork: false, snapshot: false, update: true },
    deleting: { exec: false, fork: false, snapshot: false, update: false },
    failed: { exec: false, fork: false, snapshot: false, update: true },
  };
  for (const status of STATUSES) {
    t.same({ exec: canExec(status), fork: canFork(status), snapshot: canSnapshot(status), update: canUpdate(status) }, table[status], status);
  }
});

t.test('repairFor: what reconciliation does with a box that has no operation', async (t) => {
  const table: Record<BoxStatus, { running: Repair; notRunning: Repair }> = {
    creating: { running: 'fail-interrupted', notRunning: 'fail-interrupted' },
    running: { running: 'none', notRunning: 'start' },
    stopping: { running: 'fail-interrupted', notRunning: 'fail-interrupted' },
    stopped: { running: 'stop', notRunning: 'none' },
    resuming: { running: 'fail-interrupted', notRunning: 'fail-interrupted' },
    restoring: { running: 'fail-interrupted', notRunning: 'fail-interrupted' },
    deleting: { running: 'fail-interrupted', notRunning: 'fail-interrupted' },
    failed: { running: 'none', notRunning: 'none' },
  };
  for (const status of STATUSES) {
    t.equal(repairFor(status, true), table[status].running, `${status}, container running`);
    t.equal(repairFor(status, false), table[status].notRunning, `${status}, no container running`);
  }
});
