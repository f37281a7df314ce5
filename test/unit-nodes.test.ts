/**
 * The node seam without root: the agent (workers/agent/server.ts) over a LocalNode on the mock
 * drivers, reached by HttpNodeClient on loopback; HttpNodeClient against scripted hostile or
 * broken servers; and NodeDirectory (which nodes are up, how to reach each, placement,
 * removal) on a sqlite file.
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { BoxhostError, type ErrorCode } from '../core/errors';
import { DEFAULT_EXEC_TIMEOUT_SECS } from '../core/box';
import { createLogger } from '../core/logger';
import { newBoxId, newId, now } from '../core/ids';
import { HttpNodeClient } from '../cluster/httpClient';
import { agentPath, MAX_AGENT_ANSWER_BYTES } from '../cluster/protocol';
import { EXEC_OUTPUT_CAP_BYTES, type ExecResult } from '../cluster/types';
import { startAgent, type Agent } from '../workers/agent/server';
import { LocalNode } from '../workers/agent/localNode';
import { createMockDrivers, type MockDrivers } from '../workers/mockDrivers';
import type { MockExecCall } from '../workers/runtime/mock';
import { BoxNotRunningError, ExecInputError } from '../workers/errors';
import { createDb, migrate, type Db } from '../db/knex';
import { nodesRepo, type NodeRow } from '../db/repos/nodes';
import { boxesRepo, type BoxRecord } from '../db/repos/boxes';
import { operationsRepo, type OperationStatus } from '../db/repos/operations';
import { projectsRepo } from '../db/repos/projects';
import { NodeDirectory } from '../domain/nodes';

const log = createLogger('silent');
const SECRET = 'unit-nodes-cluster-secret-0123456789';
const MiB = 1024 * 1024;

// ---------------------------------------------------------------------------------- helpers

/** The contract error a promise rejected with; a resolution or a foreign error shows up as a
 *  code no assertion expects, so the test fails with what happened. */
async function failure(p: Promise<unknown>): Promise<BoxhostError> {
  try {
    const v = await p;
    return new BoxhostError('<resolved>' as ErrorCode, `resolved with ${JSON.stringify(v)?.slice(0, 200)}`);
  } catch (e) {
    if (e instanceof BoxhostError) return e;
    return new BoxhostError('<not a BoxhostError>' as ErrorCode, String(e));
  }
}

/** A plain HTTP request, to see what the agent answers on the wire. */
function raw(url: string, method: string, p: string, headers: Record<string, string>, body?: string): Promise<{ status: number; body: unknown }> {
  return new Promise((resolve, reject) => {
    const req = http.request(new URL(p, url), { method, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (b: Buffer) => chunks.push(b));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let parsed: unknown = text;
        try {
          parsed = JSON.parse(text);
        } catch {
          // left as text
        }
        resolve({ status: res.statusCode ?? 0, body: parsed });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

interface Scripted {
  url: string;
  close(): Promise<void>;
}

/** A server on 127.0.0.1 whose every answer the test scripts. */
async function scripted(handler: (req: http.IncomingMessage, res: http.ServerResponse) => void): Promise<Scripted> {
  const server = http.createServer((req, res) => {
    res.on('error', () => undefined);
    // Read the request body so that the client's write completes.
    req.resume();
    handler(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

const json = (res: http.ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
};

const okResult: ExecResult = { exitCode: 0, stdout: 'hi\n', stderr: '', pid: 7, detached: false, truncated: false };

// ------------------------------------------------------------------ 1. agent + HttpNodeClient

t.test('agent and HttpNodeClient on loopback', async (t) => {
  const drivers: MockDrivers = createMockDrivers();
  const { runtime, storage } = drivers;
  const node = new LocalNode('n1', runtime, storage);
  const held = new Set<string>();
  const asked: string[] = [];
  const agent: Agent = await startAgent({
    node,
    secret: SECRET,
    host: '127.0.0.1',
    port: 0,
    log,
    holdsBox: async (id) => {
      asked.push(id);
      return held.has(id);
    },
  });
  t.teardown(() => agent.close());
  t.match(agent.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  const client = new HttpNodeClient('n1', agent.url, SECRET);

  // What the runtime itself answered, to compare with what crossed the wire; `patch` alters
  // the next results (fields the mock never sets).
  const direct: ExecResult[] = [];
  let patch: Partial<ExecResult> = {};
  const origExec = runtime.exec.bind(runtime);
  runtime.exec = async (id, opts) => {
    const r = { ...(await origExec(id, opts)), ...patch };
    direct.push(r);
    return r;
  };

  const start = async (boxId: string) => {
    held.add(boxId);
    await runtime.start({ boxId, hostname: boxId, rootfs: `/mock/${boxId}`, netnsPath: `/run/netns/${boxId}`, cpus: 1, ramMb: 512, environment: { BOX: 'yes' }, mounts: [] });
  };
  const running = newBoxId();
  await start(running);
  const stopped = newBoxId();
  held.add(stopped); // the db places it here; no container runs

  t.test('exec: the result arrives intact, stdin byte for byte', async (t) => {
    const stdin = Buffer.from(Array.from({ length: 512 }, (_, i) => i % 256));
    const stdout = 'out\u0000after-nul é 日本語 🙂 \u001b[0m\n';
    const calls: MockExecCall[] = [];
    runtime.execHandler = (_id, call) => {
      calls.push(call);
      return { exitCode: 3, stdout, stderr: 'warn: ünïcode\n' };
    };
    t.teardown(() => (patch = {}));
    patch = { truncated: true };
    const res = await client.exec(running, { command: ['sh', '-c', 'cat'], cwd: '/srv', env: { A: '1', EMPTY: '' }, user: 'app', stdin });
    t.equal(res.exitCode, 3);
    t.equal(res.stdout, stdout);
    t.equal(res.stderr, 'warn: ünïcode\n');
    t.equal(res.truncated, true);
    t.equal(res.detached, false);
    t.equal(res.pid, direct.at(-1)!.pid);
    t.ok(res.pid >= 1000, 'the mock runtime pid');
    t.strictSame(res, direct.at(-1), 'exactly what the runtime answered');
    t.equal(calls.length, 1);
    t.ok(Buffer.isBuffer(calls[0].stdin));
    t.ok(calls[0].stdin!.equals(stdin), 'stdin bytes unchanged (all 256 byte values)');
    t.strictSame(calls[0].command, ['sh', '-c', 'cat']);
    t.equal(calls[0].cwd, '/srv');
    t.equal(calls[0].user, 'app');
    t.strictSame(calls[0].env, { BOX: 'yes', A: '1', EMPTY: '' });

    // No stdin: the handler gets none (not an empty buffer from a base64 '').
    await client.exec(running, { command: ['true'] });
    t.equal(calls[1].stdin, undefined);
  });

  t.test('exec: detach answers at once with detached true', async (t) => {
    const res = await client.exec(running, { command: ['sleep', '100'], detach: true });
    t.strictSame(res, { exitCode: -1, stdout: '', stderr: '', pid: direct.at(-1)!.pid, detached: true, truncated: false });
  });

  t.test('exec: the worst-case answer (two capped streams of control bytes) passes', async (t) => {
    const big = '\u0001'.repeat(EXEC_OUTPUT_CAP_BYTES);
    runtime.execHandler = () => ({ exitCode: 0, stdout: big, stderr: big });
    t.teardown(() => (runtime.execHandler = () => ({ exitCode: 0, stdout: '' })));
    // With an exec timeout, as the api always sends one (300 s unless asked): the call may take
    // that plus the margin. ~200 MB of escaped JSON took past the margin alone (30 s) in a loaded
    // suite.
    const res = await client.exec(running, { command: ['yes'], timeoutMs: DEFAULT_EXEC_TIMEOUT_SECS * 1000 });
    t.equal(res.stdout.length, EXEC_OUTPUT_CAP_BYTES);
    t.equal(res.stderr.length, EXEC_OUTPUT_CAP_BYTES);
    t.ok(res.stdout === big && res.stderr === big, 'both streams unchanged');
  });

  t.test('exec: driver errors become contract errors', async (t) => {
    runtime.failNext('exec', new ExecInputError('no such directory: /nope', 'cwd'));
    let e = await failure(client.exec(running, { command: ['ls'], cwd: '/nope' }));
    t.equal(e.code, 'invalid_argument');
    t.equal(e.message, 'no such directory: /nope');
    t.strictSame(e.details, [{ field: 'cwd', issue: 'no such directory: /nope' }]);

    runtime.failNext('exec', new ExecInputError('timeout too long', 'timeout'));
    e = await failure(client.exec(running, { command: ['ls'] }));
    t.equal(e.code, 'invalid_argument');
    t.strictSame(e.details, [{ field: 'timeout_secs', issue: 'timeout too long' }]);

    // The mock's own check: an empty command.
    e = await failure(client.exec(running, { command: [''] }));
    t.equal(e.code, 'invalid_argument');
    t.strictSame(e.details, [{ field: 'command', issue: 'command must not be empty' }]);

    // A held box whose container does not run (the api asked because its row says it runs: it
    // is being restarted or recovered): 503, try again.
    e = await failure(client.exec(stopped, { command: ['ls'] }));
    t.equal(e.code, 'unavailable');
    t.match(e.message, /not running: it is being restarted or recovered/);
    t.strictSame(e.details, []);

    runtime.failNext('exec', new BoxNotRunningError('container of box x is not running'));
    e = await failure(client.exec(running, { command: ['ls'] }));
    t.equal(e.code, 'unavailable');

    const secretText = 'runc exec --root /var/lib/boxhost/runc failed: token=hunter2';
    runtime.failNext('exec', new Error(secretText));
    e = await failure(client.exec(running, { command: ['ls'] }));
    t.equal(e.code, 'internal');
    t.match(e.message, /^internal error on the node \(ref [0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\)$/);
    t.notOk(e.message.includes('hunter2') || e.message.includes('/var/lib'), 'the original text stays on the node');
    t.strictSame(e.details, []);

    // An `internal` BoxhostError is not passed through either.
    runtime.failNext('exec', new BoxhostError('internal', `wrapped: ${secretText}`));
    e = await failure(client.exec(running, { command: ['ls'] }));
    t.equal(e.code, 'internal');
    t.notOk(e.message.includes('hunter2'));

    // The runtime works again afterwards (failNext is one call).
    runtime.execHandler = () => ({ exitCode: 0, stdout: 'fine' });
    t.equal((await client.exec(running, { command: ['ls'] })).stdout, 'fine');
  });

  t.test('a box the node does not hold, or a malformed id, is not_found', async (t) => {
    const other = newBoxId();
    await runtime.start({ boxId: other, hostname: other, rootfs: '/x', netnsPath: '/x', cpus: 1, ramMb: 64, environment: {}, mounts: [] });
    // A container runs, but the db does not place the box here.
    let e = await failure(client.exec(other, { command: ['ls'] }));
    t.equal(e.code, 'not_found');
    t.equal(e.message, `box ${other} on node n1 not found`);
    e = await failure(client.listSnapshots(other));
    t.equal(e.code, 'not_found');
    e = await failure(client.updateLimits(other, { cpus: 1 }));
    t.equal(e.code, 'not_found');
    t.strictSame(runtime.updates.filter((u) => u.boxId === other), []);

    asked.length = 0;
    for (const bad of ['Bad-Id', 'a'.repeat(33), 'a_b']) {
      held.add(bad); // even if the db said so, the id is refused first
      e = await failure(client.exec(bad, { command: ['ls'] }));
      t.equal(e.code, 'not_found', `exec ${bad}`);
      e = await failure(client.listSnapshots(bad));
      t.equal(e.code, 'not_found', `snapshots ${bad}`);
    }
    t.strictSame(asked, [], 'holdsBox is never asked about a malformed id');
  });

  t.test('a request without the right secret is refused', async (t) => {
    const body = JSON.stringify({ command: ['ls'] });
    const want = { error: { code: 'unauthenticated', message: 'the cluster secret is missing or wrong', details: [] } };
    for (const [what, headers] of [
      ['missing', {}],
      ['wrong', { authorization: 'Bearer not-the-secret' }],
      ['not bearer', { authorization: `Basic ${SECRET}` }],
      ['secret with a suffix', { authorization: `Bearer ${SECRET}x` }],
    ] as [string, Record<string, string>][]) {
      const r = await raw(agent.url, 'POST', agentPath('exec', running), { 'content-type': 'application/json', ...headers }, body);
      t.equal(r.status, 401, what);
      t.strictSame(r.body, want, what);
    }
    const h = await raw(agent.url, 'GET', agentPath('health'), {});
    t.equal(h.status, 401);

    // With the secret, the same raw call works; health answers.
    const ok = await raw(agent.url, 'GET', agentPath('health'), { authorization: `Bearer ${SECRET}` });
    t.equal(ok.status, 200);
    t.match(ok.body, { node: 'n1', storage: 'ok' });
    const badJson = await raw(agent.url, 'POST', agentPath('exec', running), { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' }, '{"command": [');
    t.equal(badJson.status, 400);
    t.match(badJson.body, { error: { code: 'invalid_argument', message: 'the body is not valid JSON' } });

    const wrong = new HttpNodeClient('n1', agent.url, 'a-wrong-secret-of-some-length');
    let ran = 0;
    runtime.execHandler = () => {
      ran++;
      return { exitCode: 0, stdout: '' };
    };
    t.teardown(() => (runtime.execHandler = () => ({ exitCode: 0, stdout: '' })));
    for (const [what, p] of [
      ['exec', wrong.exec(running, { command: ['ls'] })],
      ['listSnapshots', wrong.listSnapshots(running)],
      ['updateLimits', wrong.updateLimits(running, { cpus: 2 })],
    ] as [string, Promise<unknown>][]) {
      const e = await failure(p);
      t.equal(e.code, 'unavailable', what);
      t.equal(e.message, 'node n1 refused the cluster secret', what);
    }
    t.equal(ran, 0, 'nothing ran with the wrong secret');
  });

  t.test('updateLimits: a running box at once, a stopped one not', async (t) => {
    const before = runtime.updates.length;
    await client.updateLimits(running, { cpus: 2, ramMb: 256 });
    t.strictSame(runtime.updates.slice(before), [{ boxId: running, limits: { cpus: 2, ramMb: 256 } }]);

    t.equal(await client.updateLimits(stopped, { ramMb: 1024 }), undefined);
    t.equal(runtime.updates.length, before + 1, 'nothing applied to a stopped box');

    const e = await failure(client.updateLimits(running, { ramMb: 1 }));
    t.equal(e.code, 'invalid_argument');
    t.equal(runtime.updates.length, before + 1);
  });

  t.test('listSnapshots: what the storage holds', async (t) => {
    const base = { name: 'tiny', version: 'v1' };
    await storage.createBase(base, async (dir) => fs.promises.writeFile(path.join(dir, 'f'), 'x'));
    await storage.createBoxRoot(running, { kind: 'base', base });
    t.strictSame(await client.listSnapshots(running), []);
    await storage.snapshotBoxRoot(running, 'one');
    await storage.snapshotBoxRoot(running, 'two');
    const want = await storage.listBoxSnapshots(running);
    t.equal(want.length, 2);
    t.strictSame(await client.listSnapshots(running), want);

    // A storage failure is internal, without its text.
    const e = await failure(client.listSnapshots(stopped));
    t.equal(e.code, 'internal');
    t.notOk(e.message.includes(stopped), 'the driver message stays on the node');
  });
});

// ------------------------------------------------------- 2. HttpNodeClient vs hostile servers

t.test('HttpNodeClient against hostile or broken servers', async (t) => {
  t.test('connection refused → unavailable', async (t) => {
    const s = await scripted((_req, res) => json(res, 200, {}));
    await s.close();
    const c = new HttpNodeClient('gone', s.url, SECRET);
    const e = await failure(c.exec(newBoxId(), { command: ['ls'] }));
    t.equal(e.code, 'unavailable');
    t.equal(e.message, 'node gone is not answering: connection refused');
    const e2 = await failure(c.listSnapshots(newBoxId()));
    t.equal(e2.code, 'unavailable');
    t.match(e2.message, /connection refused/);
  });

  t.test('the 5 s limit is on an exec\'s headers only', async (t) => {
    const hung = await scripted(() => undefined); // accepts, never answers
    const slowBody = await scripted((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.flushHeaders();
      setTimeout(() => res.end(JSON.stringify({ result: okResult })), 7000);
    });
    const slowSnapshots = await scripted((_req, res) => {
      setTimeout(() => json(res, 200, { snapshots: [{ name: 's1', createdAt: '2024-01-01T00:00:00.000Z', sizeBytes: 42 }] }), 6000);
    });
    t.teardown(async () => {
      await Promise.all([hung.close(), slowBody.close(), slowSnapshots.close()]);
    });
    const timed = async <T>(p: Promise<T>) => {
      const at = Date.now();
      const outcome = await p.then(
        (value) => ({ value, error: undefined }),
        (error: unknown) => ({ value: undefined, error }),
      );
      return { ...outcome, ms: Date.now() - at };
    };
    const [h, b, s] = await Promise.all([
      timed(new HttpNodeClient('hung', hung.url, SECRET).exec(newBoxId(), { command: ['ls'] })),
      timed(new HttpNodeClient('slow', slowBody.url, SECRET).exec(newBoxId(), { command: ['sleep', '7'] })),
      timed(new HttpNodeClient('slowsnap', slowSnapshots.url, SECRET).listSnapshots(newBoxId())),
    ]);

    t.ok(h.error instanceof BoxhostError, 'the hung exec rejects');
    t.equal((h.error as BoxhostError).code, 'unavailable');
    t.equal((h.error as BoxhostError).message, 'node hung did not answer within 5 s');
    t.ok(h.ms >= 4500 && h.ms < 8000, `hung exec failed after ${h.ms} ms`);

    t.equal(b.error, undefined, 'the exec whose body comes after 7 s succeeds');
    t.strictSame(b.value, okResult);
    t.ok(b.ms >= 6900, `it waited for the body (${b.ms} ms)`);

    t.equal(s.error, undefined, 'a non-exec call answered after 6 s succeeds');
    t.strictSame(s.value, [{ name: 's1', createdAt: '2024-01-01T00:00:00.000Z', sizeBytes: 42 }]);
    t.ok(s.ms >= 5900, `it waited for the answer (${s.ms} ms)`);
  });

  t.test('an answer over MAX_AGENT_ANSWER_BYTES is refused', async (t) => {
    let sent = 0;
    let closed = false;
    const s = await scripted((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      // Valid JSON if read to its end: only the cap can refuse it.
      res.write('{"snapshots":[');
      const chunk = Buffer.alloc(MiB, 0x20);
      const limit = MAX_AGENT_ANSWER_BYTES + 64 * MiB;
      res.on('close', () => (closed = true));
      const pump = () => {
        while (sent < limit) {
          if (closed || res.destroyed) return;
          sent += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', pump);
        }
        res.end(']}');
      };
      pump();
    });
    t.teardown(() => s.close());
    const e = await failure(new HttpNodeClient('big', s.url, SECRET).listSnapshots(newBoxId()));
    t.equal(e.code, 'unavailable');
    t.equal(e.message, `node big answered more than ${MAX_AGENT_ANSWER_BYTES} bytes`);
    t.ok(sent < MAX_AGENT_ANSWER_BYTES + 64 * MiB, `the client hung up before the end (${sent} bytes sent)`);
  });

  t.test('an exec answer of 8 MiB of NUL bytes, JSON-escaped (~48 MB), is accepted', async (t) => {
    const n = 8 * MiB;
    const nuls = '\u0000'.repeat(n);
    const body = JSON.stringify({ result: { ...okResult, stdout: nuls } });
    t.ok(body.length > 48 * MiB, `the body is ${body.length} bytes`);
    const s = await scripted((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.flushHeaders();
      res.end(body);
    });
    t.teardown(() => s.close());
    const r = await new HttpNodeClient('nul', s.url, SECRET).exec(newBoxId(), { command: ['head', '-c', '8M', '/dev/zero'] });
    t.equal(r.stdout.length, n);
    t.ok(r.stdout === nuls, 'stdout is all NUL bytes');
    t.equal(r.exitCode, 0);
  });

  t.test('malformed bodies', async (t) => {
    // Path → how the server answers.
    const answers = new Map<string, (res: http.ServerResponse) => void>();
    const s = await scripted((req, res) => {
      const a = answers.get(req.url ?? '');
      if (a) a(res);
      else json(res, 404, { error: { code: 'not_found', message: 'unscripted', details: [] } });
    });
    t.teardown(() => s.close());
    const c = new HttpNodeClient('m', s.url, SECRET);
    const envelope = (body: string) => (res: http.ServerResponse) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.flushHeaders();
      res.end(body);
    };
    let i = 0;
    /** The outcome of an exec (or `snapshots`) answered by `answer`. */
    const run = async (call: 'exec' | 'snapshots' | 'limits', answer: (res: http.ServerResponse) => void) => {
      const id = `b${i++}`;
      answers.set(agentPath(call, id), answer);
      if (call === 'exec') return failure(c.exec(id, { command: ['ls'] }));
      if (call === 'limits') return failure(c.updateLimits(id, { cpus: 1 }));
      return failure(c.listSnapshots(id));
    };

    t.test('not JSON', async (t) => {
      let e = await run('snapshots', (res) => {
        res.writeHead(200, { 'content-type': 'text/html' });
        res.end('<html>proxy error</html>');
      });
      t.equal(e.code, 'unavailable');
      t.equal(e.message, 'node m answered 200 without a JSON body');
      e = await run('exec', envelope('{"result": {"exitCode": 0,'));
      t.equal(e.code, 'unavailable');
      t.equal(e.message, 'node m answered 200 without a JSON body');
      e = await run('exec', (res) => {
        res.writeHead(502);
        res.end('bad gateway');
      });
      t.equal(e.code, 'unavailable');
      t.equal(e.message, 'node m answered 502 without a JSON body');
    });

    t.test('a result that breaks the schema', async (t) => {
      const { exitCode: _dropped, ...noExit } = okResult;
      let e = await run('exec', envelope(JSON.stringify({ result: noExit })));
      t.equal(e.code, 'unavailable');
      t.match(e.message, /^node m answered a malformed body: .*"exitCode" is required/);
      e = await run('exec', envelope(JSON.stringify({ result: { ...okResult, pid: -1 } })));
      t.equal(e.code, 'unavailable');
      t.match(e.message, /^node m answered a malformed body: /);
      e = await run('exec', envelope(JSON.stringify({ result: { ...okResult, stdout: 5 } })));
      t.equal(e.code, 'unavailable');
      e = await run('snapshots', (res) => json(res, 200, { snapshots: [{ name: 'x' }] }));
      t.equal(e.code, 'unavailable');
      t.match(e.message, /^node m answered a malformed body: /);
      e = await run('snapshots', (res) => json(res, 200, null));
      t.equal(e.code, 'unavailable');
    });

    t.test('an error body with an unknown code is internal', async (t) => {
      let e = await run('exec', envelope(JSON.stringify({ error: { code: 'weird', message: 'odd', details: [] } })));
      t.equal(e.code, 'internal');
      t.equal(e.message, 'odd');
      e = await run('snapshots', (res) => json(res, 418, { error: { code: 'weird', message: 'odd' } }));
      t.equal(e.code, 'internal');
      // A code of the contract an agent has no business answering is not passed through.
      e = await run('exec', envelope(JSON.stringify({ error: { code: 'not_ready', message: 'no' } })));
      t.equal(e.code, 'internal');
    });

    t.test('an error body with a known code keeps its code and details', async (t) => {
      const details = [{ field: 'cwd', issue: 'no such directory' }];
      let e = await run('exec', envelope(JSON.stringify({ error: { code: 'conflict', message: 'busy', details } })));
      t.equal(e.code, 'conflict');
      t.equal(e.message, 'busy');
      t.strictSame(e.details, details);
      e = await run('limits', (res) => json(res, 409, { error: { code: 'conflict', message: 'busy', details } }));
      t.equal(e.code, 'conflict');
      t.strictSame(e.details, details);
      e = await run('snapshots', (res) => json(res, 507, { error: { code: 'insufficient_storage', message: 'full' } }));
      t.equal(e.code, 'insufficient_storage');
      t.strictSame(e.details, []);
    });

    t.test('details without a field are malformed', async (t) => {
      let e = await run('limits', (res) => json(res, 409, { error: { code: 'conflict', message: 'busy', details: [{ issue: 'x' }] } }));
      t.equal(e.code, 'unavailable');
      t.equal(e.message, 'node m answered 409');
      e = await run('exec', envelope(JSON.stringify({ error: { code: 'conflict', message: 'busy', details: [{ issue: 'x' }] } })));
      t.equal(e.code, 'unavailable');
      e = await run('exec', envelope(JSON.stringify({ error: 'text' })));
      t.equal(e.code, 'unavailable');
    });

    t.test('an exec envelope with neither result nor error is malformed', async (t) => {
      let e = await run('exec', envelope('{}'));
      t.equal(e.code, 'unavailable', '{} is no exec result');
      t.match(e.message, /^node m answered a malformed body/, e.message);
      e = await run('exec', envelope('null'));
      t.equal(e.code, 'unavailable', 'null is no exec result');
      t.match(e.message, /^node m answered a malformed body/, e.message);
    });

    t.test('a 204 is no exec result and no snapshot list', async (t) => {
      const noContent = (res: http.ServerResponse) => {
        res.writeHead(204);
        res.end();
      };
      let e = await run('exec', noContent);
      t.equal(e.code, 'unavailable', 'exec answered 204');
      t.match(e.message, /^node m answered/, e.message);
      e = await run('snapshots', noContent);
      t.equal(e.code, 'unavailable', 'snapshots answered 204');
      t.match(e.message, /^node m answered/, e.message);
    });
  });
});

// ---------------------------------------------------------------------- 3. NodeDirectory

t.test('NodeDirectory', async (t) => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-nodes-'));
  const db: Db = createDb({ dataDir, databaseUrl: undefined });
  const emptyDb: Db = createDb({ dataDir: path.join(dataDir, 'empty'), databaseUrl: undefined });
  await migrate(db);
  await migrate(emptyDb);
  t.teardown(async () => {
    await db.destroy();
    await emptyDb.destroy();
    fs.rmSync(dataDir, { recursive: true, force: true });
  });
  const TIMEOUT_MS = 10_000;
  const dir = (opts: { secret?: string; d?: Db } = {}) => new NodeDirectory(opts.d ?? db, { secret: 'secret' in opts ? opts.secret : SECRET, timeoutMs: TIMEOUT_MS });
  const ago = (ms: number) => new Date(Date.now() - ms).toISOString();

  /** A box's ask that fits every node of these tests. */
  const SMALL = { cpus: 1, ram_mb: 64, storage_gb: 1 };
  async function addNode(id: string, patch: Partial<NodeRow> = {}): Promise<void> {
    const at = now();
    await db<NodeRow>('nodes').insert({
      id, name: id, region: 'r', agent_url: `http://${id}.internal:8082`, state: 'active', cpus: 4, ram_mb: 8192, disk_gb: 100,
      version: '0.1.0', started_at: at, heartbeat_at: at, storage: 'ok', created_at: at, updated_at: at, ...patch,
    });
  }
  await projectsRepo.ensure(db, 'demo', 256);
  let boxN = 0;
  async function addBox(node: string, config: { cpus: number; ram_mb: number }): Promise<BoxRecord> {
    const at = now();
    const box: BoxRecord = {
      id: newBoxId(), project: 'demo', name: `box${boxN++}`, status: 'running', error: null, base: 'tiny@v1', fork: null,
      config: { cpus: config.cpus, ram_mb: config.ram_mb, region: 'r', storage_gb: 3 }, environment: {}, tags: {}, data_mounts: [],
      lifecycle: null, pack: null, pack_rev: null, rollback_to: null, termination_grace_period_seconds: 10, url_settings: null,
      node, address: '10.88.0.2', created_at: at, updated_at: at,
    };
    await boxesRepo.insert(db, box);
    return box;
  }
  async function addOperation(node: string | null, status: OperationStatus, boxId: string | null = null): Promise<string> {
    const id = newId('op');
    const at = now();
    await operationsRepo.insert(db, {
      id, kind: 'box.stop', status, resource: '/v1/projects/demo/boxes/x', box_id: boxId, project: 'demo', node,
      progress: null, error: null, payload: '{}', created_by: null, created_at: at, updated_at: at,
    });
    return id;
  }

  t.test('place: with no node at all → unavailable', async (t) => {
    const e = await failure(dir({ d: emptyDb }).place('r', SMALL));
    t.equal(e.code, 'unavailable');
    t.equal(e.message, 'no node has registered yet: start a node');
  });

  t.test('place: each tie-breaker decides one case', async (t) => {
    // Free RAM decides, though the winner has fewer CPUs, more boxes and the higher id (and
    // less RAM before its boxes are counted).
    await addNode('ram-a', { region: 'ram', ram_mb: 16000, cpus: 16 });
    await addBox('ram-a', { cpus: 1, ram_mb: 12000 }); // free 4000 MB, 15 CPUs, 1 box
    await addNode('ram-b', { region: 'ram', ram_mb: 8000, cpus: 2 });
    await addBox('ram-b', { cpus: 0, ram_mb: 100 });
    await addBox('ram-b', { cpus: 0, ram_mb: 100 }); // free 7800 MB, 2 CPUs, 2 boxes
    // Equal free RAM: free CPUs decide, though the winner has more boxes and the higher id
    // (and the same CPUs before its boxes are counted).
    await addNode('cpu-a', { region: 'cpu', ram_mb: 8000, cpus: 8 });
    await addBox('cpu-a', { cpus: 6, ram_mb: 1000 }); // free 7000 MB, 2 CPUs, 1 box
    await addNode('cpu-b', { region: 'cpu', ram_mb: 9000, cpus: 8 });
    await addBox('cpu-b', { cpus: 1, ram_mb: 1000 });
    await addBox('cpu-b', { cpus: 1, ram_mb: 1000 }); // free 7000 MB, 6 CPUs, 2 boxes
    // Equal RAM and CPUs: fewer boxes decide, though the winner has the higher id.
    await addNode('few-a', { region: 'few', ram_mb: 8000, cpus: 4 });
    await addBox('few-a', { cpus: 1, ram_mb: 500 });
    await addBox('few-a', { cpus: 1, ram_mb: 500 }); // free 7000 MB, 2 CPUs, 2 boxes
    await addNode('few-b', { region: 'few', ram_mb: 7500, cpus: 3 });
    await addBox('few-b', { cpus: 1, ram_mb: 500 }); // free 7000 MB, 2 CPUs, 1 box
    // All equal: the lowest id (inserted last, so insertion order does not decide).
    await addNode('id-b', { region: 'id' });
    await addNode('id-a', { region: 'id' });

    const d = dir();
    t.equal(await d.place('ram', SMALL), 'ram-b', 'most free RAM');
    t.equal(await d.place('cpu', SMALL), 'cpu-b', 'then most free CPUs');
    t.equal(await d.place('few', SMALL), 'few-b', 'then fewest boxes');
    t.equal(await d.place('id', SMALL), 'id-a', 'then the lowest id');
  });

  t.test('place: draining, down, signed-off and storage-failing nodes are skipped', async (t) => {
    // Each unfit node would win on free RAM.
    const big = { ram_mb: 64000, cpus: 64 };
    await addNode('skip-drain', { region: 'skip', state: 'draining', ...big });
    await addNode('skip-down', { region: 'skip', heartbeat_at: ago(60_000), ...big });
    await nodesRepo.register(db, { id: 'skip-off', name: 'off', region: 'skip', agent_url: null, cpus: 64, ram_mb: 64000, disk_gb: 100, alloc_cpus: null, alloc_ram_mb: null, alloc_disk_gb: null, version: '0.1.0' });
    await nodesRepo.signOff(db, 'skip-off');
    await nodesRepo.register(db, { id: 'skip-sick', name: 'sick', region: 'skip', agent_url: null, cpus: 64, ram_mb: 64000, disk_gb: 100, alloc_cpus: null, alloc_ram_mb: null, alloc_disk_gb: null, version: '0.1.0' });
    await nodesRepo.heartbeat(db, 'skip-sick', 'error: pool tank is UNAVAIL');
    await addNode('skip-small', { region: 'skip', ram_mb: 1024, cpus: 1 });
    await addNode('skip-small2', { region: 'skip', ram_mb: 512, cpus: 1 });
    t.equal(await dir().place('skip', SMALL), 'skip-small');

    await addNode('none-drain', { region: 'none', state: 'draining' });
    const oldBeat = ago(60_000);
    await addNode('none-down', { region: 'none', heartbeat_at: oldBeat });
    await addNode('none-off', { region: 'none', heartbeat_at: null });
    await addNode('none-sick', { region: 'none', storage: 'error: no answer within 2 s' });
    const e = await failure(dir().place('none', SMALL));
    t.equal(e.code, 'unavailable');
    t.equal(
      e.message,
      `no node of region none can take a box now: node none-down is not answering (last heartbeat ${oldBeat}); node none-drain is draining; node none-off is stopped; node none-sick's storage is failing`,
    );
  });

  t.test('place and assertRoom: a node holds no more box roots than its storage can mount', async (t) => {
    // roots-a can mount 2 roots and holds 2; roots-b mounts 3 and holds 1, with less RAM free.
    await addNode('roots-a', { region: 'roots', ram_mb: 64000, alloc_boxes: 2 });
    await addBox('roots-a', { cpus: 0, ram_mb: 10 });
    await addBox('roots-a', { cpus: 0, ram_mb: 10 });
    await addNode('roots-b', { region: 'roots', ram_mb: 2048, alloc_boxes: 3 });
    await addBox('roots-b', { cpus: 0, ram_mb: 10 });
    const NEW = { ...SMALL, boxes: 1 };
    t.equal(await dir().place('roots', NEW), 'roots-b', 'the node with RAM to spare is full of roots: passed over');
    t.equal(await dir().place('roots', SMALL), 'roots-a', 'an ask for no new root (an update) is not held to it');
    await addBox('roots-b', { cpus: 0, ram_mb: 10 });
    await addBox('roots-b', { cpus: 0, ram_mb: 10 });
    const e = await failure(dir().place('roots', NEW));
    t.equal(e.code, 'insufficient_storage', 'mounts are storage: 507');
    t.equal(
      e.message,
      'region roots has no room for a box of 1 cpus, 64 MB RAM, 1 GB storage more: node roots-a has 2 of the 2 box roots its storage can mount promised; ' +
        'node roots-b has 3 of the 3 box roots its storage can mount promised (zfs-fuse mounts at most 1000 filesystems per machine, fewer with a small max-arc-size; delete boxes there, or add a node)',
    );
    t.same(e.details, [{ field: 'name', issue: 'no node can mount another box root' }]);
    const fork = await failure(dir().assertRoom('roots-b', NEW));
    t.equal(fork.code, 'insufficient_storage', 'a fork on a full node too');
    const inTrx = await failure(db.transaction((trx) => dir().assertRootRoom(trx, 'roots-b', SMALL)));
    t.equal(inTrx.code, 'insufficient_storage', 'and again inside the insert transaction (creates at the edge count in turn)');
    await db.transaction((trx) => dir().assertRootRoom(trx, 'ram-a', SMALL));
    t.pass('a node without the limit passes it (control)');
    await dir().assertRoom('roots-b', { cpus: 0, ram_mb: 1, storage_gb: 0 });
    t.pass('a box on it may still grow');
    // A heartbeat carries the limit as the storage reads it now.
    await nodesRepo.heartbeat(db, 'roots-b', 'ok', 4);
    t.equal(await dir().place('roots', NEW), 'roots-b', 'room again once the heartbeat says so');
    t.equal((await dir().list()).find((n) => n.id === 'roots-b')?.allocatable.boxes, 4);
    await nodesRepo.heartbeat(db, 'roots-b', 'ok');
    t.equal((await nodesRepo.get(db, 'roots-b'))?.alloc_boxes, 4, 'a heartbeat that does not say keeps it');
  });

  t.test('place: an unknown region → invalid_argument on config.region', async (t) => {
    const e = await failure(dir().place('mars', SMALL));
    t.equal(e.code, 'invalid_argument');
    t.equal(e.details.length, 1);
    t.equal(e.details[0].field, 'config.region');
    t.match(e.details[0].issue, /^no node serves region mars \(regions: .*\bram\b.*\)$/);
  });

  t.test('downNodes and client()', async (t) => {
    await nodesRepo.register(db, { id: 'up1', name: 'up1', region: 'c', agent_url: 'http://10.0.0.2:8082', cpus: 2, ram_mb: 2048, disk_gb: 10, alloc_cpus: null, alloc_ram_mb: null, alloc_disk_gb: null, version: '0.1.0' });
    const oldBeat = ago(TIMEOUT_MS + 5_000);
    await addNode('old1', { region: 'c', heartbeat_at: oldBeat });
    await addNode('edge1', { region: 'c', heartbeat_at: ago(TIMEOUT_MS - 3_000) });
    await addNode('off1', { region: 'c', heartbeat_at: null });
    await addNode('noagent1', { region: 'c', agent_url: null });
    const local = new LocalNode('here', createMockDrivers().runtime, createMockDrivers().storage);
    const d = dir();
    d.addLocal(local);

    // 'ghost' has no row: a node forgotten for good is not listed as down (its boxes' rows
    // say they are lost), but it cannot be reached either (below).
    const down = await d.downNodes(['up1', 'old1', 'edge1', 'off1', 'here', 'ghost', 'old1']);
    t.strictSame(
      [...down].sort(),
      [
        ['off1', 'node off1 is stopped'],
        ['old1', `node old1 is not answering (last heartbeat ${oldBeat})`],
      ],
    );
    t.strictSame([...(await d.downNodes(['here']))], [], 'the local node is up with no row at all');

    t.equal(await d.client('here'), local, 'the local node is that very object');
    const c = await d.client('up1');
    t.ok(c instanceof HttpNodeClient, 'a remote up node gives an HttpNodeClient');
    t.equal(c.nodeId, 'up1');
    t.equal((c as HttpNodeClient).agentUrl, 'http://10.0.0.2:8082');
    t.equal(await d.client('up1'), c, 'kept for the next call');
    t.ok((await d.client('edge1')) instanceof HttpNodeClient, 'a heartbeat within the timeout is up');

    let e = await failure(d.client('old1'));
    t.equal(e.code, 'unavailable');
    t.equal(e.message, `node old1 is not answering (last heartbeat ${oldBeat})`);
    e = await failure(d.client('off1'));
    t.equal(e.code, 'unavailable');
    t.equal(e.message, 'node off1 is stopped');
    e = await failure(d.client('ghost'));
    t.equal(e.code, 'unavailable');
    t.equal(e.message, 'node ghost is not registered');
    e = await failure(d.client('noagent1'));
    t.equal(e.code, 'unavailable');
    t.match(e.message, /^node noagent1 has no agent address/);
    e = await failure(d.assertUp('old1'));
    t.equal(e.code, 'unavailable');
    t.equal(await d.assertUp('up1'), undefined);

    const noSecret = dir({ secret: undefined });
    noSecret.addLocal(local);
    e = await failure(noSecret.client('up1'));
    t.equal(e.code, 'unavailable');
    t.equal(e.message, 'node up1 runs apart from this api, and this api has no BOXHOST_CLUSTER_SECRET to reach it');
    t.equal(await noSecret.client('here'), local, 'the local node needs no secret');
  });

  t.test('remove()', async (t) => {
    const dropped: string[] = [];
    const queue = { drop: async (id: string) => void dropped.push(id) };
    const d = dir();

    // Up: refused.
    await addNode('rm-up');
    let e = await failure(d.remove('rm-up', { force: true, queue }));
    t.equal(e.code, 'conflict');
    t.match(e.message, /^node rm-up is up/);
    t.ok(await nodesRepo.get(db, 'rm-up'), 'the row stays');

    e = await failure(d.remove('rm-nobody', { queue }));
    t.equal(e.code, 'not_found');

    // Down with boxes: refused without force.
    await addNode('rm-dead', { heartbeat_at: ago(60_000) });
    const b1 = await addBox('rm-dead', { cpus: 1, ram_mb: 256 });
    const b2 = await addBox('rm-dead', { cpus: 1, ram_mb: 256 });
    await boxesRepo.update(db, b2.id, { status: 'stopped', address: null });
    const elsewhere = await addBox('rm-up', { cpus: 1, ram_mb: 256 });
    const opQueued = await addOperation('rm-dead', 'queued', b1.id);
    const opRunning = await addOperation('rm-dead', 'running', b2.id);
    const opDone = await addOperation('rm-dead', 'succeeded', b1.id);
    const opOther = await addOperation('rm-up', 'queued', elsewhere.id);
    const opHostWide = await addOperation(null, 'queued');

    e = await failure(d.remove('rm-dead', { queue }));
    t.equal(e.code, 'conflict');
    t.match(e.message, /^node rm-dead still holds 2 boxes/);
    t.ok(await nodesRepo.get(db, 'rm-dead'), 'the row stays');
    t.equal((await boxesRepo.byId(db, b1.id))!.status, 'running');
    t.equal((await operationsRepo.get(db, opQueued))!.status, 'queued');
    t.strictSame(dropped, []);
    t.equal(await d.forgotten('rm-dead'), false);

    // Forced: the boxes are lost, the unfinished operations fail, the row and queue go.
    await d.remove('rm-dead', { force: true, queue });
    const lost = 'node rm-dead was removed while down: this box is lost; delete it';
    for (const b of [b1, b2]) {
      const r = (await boxesRepo.byId(db, b.id))!;
      t.equal(r.status, 'failed', `box ${b.name} failed`);
      t.equal(r.error, lost);
      t.equal(r.address, null);
    }
    const other = (await boxesRepo.byId(db, elsewhere.id))!;
    t.equal(other.status, 'running', 'a box of another node is untouched');
    t.equal(other.error, null);
    for (const id of [opQueued, opRunning]) {
      const op = (await operationsRepo.get(db, id))!;
      t.equal(op.status, 'failed');
      t.equal(op.error, 'lost: node rm-dead was removed');
    }
    t.equal((await operationsRepo.get(db, opDone))!.status, 'succeeded', 'a finished operation stays as it was');
    t.equal((await operationsRepo.get(db, opDone))!.error, null);
    t.equal((await operationsRepo.get(db, opOther))!.status, 'queued', 'another node\'s operation is untouched');
    t.equal((await operationsRepo.get(db, opHostWide))!.status, 'queued', 'a host-wide operation is untouched');
    t.equal(await nodesRepo.get(db, 'rm-dead'), undefined, 'the row is gone');
    t.strictSame(dropped, ['rm-dead'], 'the queue is dropped once');
    t.equal(await d.forgotten('rm-dead'), true);
    t.equal(await d.forgotten('rm-up'), false);
    const withLocal = dir();
    withLocal.addLocal(new LocalNode('solo', createMockDrivers().runtime, createMockDrivers().storage));
    t.equal(await withLocal.forgotten('solo'), false, 'the local node is never forgotten');

    // Down without boxes: no force needed.
    await addNode('rm-empty', { heartbeat_at: null });
    await d.remove('rm-empty', { queue });
    t.equal(await nodesRepo.get(db, 'rm-empty'), undefined);
    t.strictSame(dropped, ['rm-dead', 'rm-empty']);
  });
});
