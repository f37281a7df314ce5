import { BoxhostError } from '../../core/errors';
import type { NodeServiceSpec, NodeServiceState, ServiceGate } from '../../cluster/types';
import type { BoxServices } from '../drivers';

/** Between two looks of a ready gate. */
const GATE_LOOK_MS = 150;
/** The output lines a failed gate's message carries. */
const GATE_LOG_LINES = 20;
/** The most of those lines a message holds. */
const GATE_LOG_BYTES = 4000;

/**
 * Starts a service in a box and, with a gate, waits until it passes (docs/services.md "Ready
 * gates"): the gate is looked at from inside the box (its own loopback, through boxd) every
 * GATE_LOOK_MS. A service that ends for good (`exited`, `failed`) fails the gate at once; one
 * whose policy restarts it is given the whole time. A gate that fails stops the service, lists
 * it `failed` with the reason in its log, and answers 409 `not_ready` naming the gate, with the
 * service's last output lines in the message.
 */
export async function startService(services: BoxServices, spec: NodeServiceSpec, gate?: ServiceGate): Promise<{ service: NodeServiceState; replaced: boolean }> {
  const probe = () => services.probe({ port: gate!.port, http: gate!.path, status: gate!.status });
  // One look before the start: a box whose agent cannot look (a boxd before 1.2.0) refuses the
  // gate with nothing started.
  if (gate) await probe();
  const started = await services.start(spec as Parameters<BoxServices['start']>[0]);
  if (!gate) return started;
  const field = gate.path === undefined ? 'ready.tcp' : 'ready.http';
  const deadline = Date.now() + gate.timeoutMs;
  let issue = 'not ready';
  for (;;) {
    let look: Awaited<ReturnType<typeof probe>>;
    let now: NodeServiceState;
    try {
      look = await probe();
      if (look.ok) return { service: await services.get(spec.name), replaced: started.replaced };
      now = await services.get(spec.name);
    } catch (e) {
      // The gate cannot be looked at (the agent went away): the service does not stay up unpublished.
      await services.stop(spec.name, { fail: `${field}: the gate could not be looked at: ${(e as Error).message}` }).catch(() => undefined);
      throw e;
    }
    issue = look.issue ?? issue;
    if (now.state === 'exited' || now.state === 'failed') {
      issue = `${issue}; the service ${now.state}${now.lastExitCode === null ? '' : ` with exit code ${now.lastExitCode}`}`;
      break;
    }
    const left = deadline - Date.now();
    if (left <= 0) {
      issue = `${issue} after ${Math.round(gate.timeoutMs / 1000)} s`;
      break;
    }
    await new Promise((r) => setTimeout(r, Math.min(GATE_LOOK_MS, left)));
  }
  await services.stop(spec.name, { fail: `${field}: ${issue}` }).catch(() => undefined);
  const tail = await logTail(services, spec.name);
  const message = `service ${spec.name} is not ready: ${field}: ${issue}${tail ? `; its last output:\n${tail}` : '; it wrote no output'}`;
  throw new BoxhostError('not_ready', message, [{ field, issue }]);
}

/** The last lines a service wrote (without boxd's own closing line), or '' if none could be read. */
async function logTail(services: BoxServices, name: string): Promise<string> {
  try {
    const data = await services.logs(name, { tail: GATE_LOG_LINES + 1 });
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const c of data as AsyncIterable<Buffer>) {
      chunks.push(c);
      size += c.length;
      if (size > 64 * 1024) break;
    }
    data.destroy();
    const lines = Buffer.concat(chunks).toString('utf8').split('\n').filter((l) => l && !l.startsWith('boxd: the service failed:'));
    return lines.slice(-GATE_LOG_LINES).join('\n').slice(-GATE_LOG_BYTES);
  } catch {
    return '';
  }
}
