import fs from 'node:fs';
import path from 'node:path';
import type { BoxFiles, BoxServices, ContainerStatus } from '../drivers';
import { BoxdClient } from './boxd/client';
import { BoxdUnreachableError } from './boxd/answers';
import { BoxdServices } from './boxd/services';
import { BOX_BOXD } from './ociSpec';
import { BoxAgentUnavailableError, BoxNeedsRestartError, BoxNotRunningError } from '../errors';

/** What the agents need of the runtime: where a box's bundle and socket are, and its status. */
export interface BoxAgentsHost {
  bundlePath(boxId: string): string;
  containerId(boxId: string): string;
  status(boxId: string): Promise<ContainerStatus | null>;
}

/**
 * The boxd of each box of a runtime: its client (null for a box whose PID 1 is not boxd, one
 * started before boxd existed), the files and services calls made through it, and its health.
 * An agent that cannot be reached because its box is not running says so (409), not that the
 * agent is down (503).
 */
export class BoxAgents {
  /** Whether each box runs boxd (read from its bundle after a restart of this process). */
  private readonly agents = new Map<string, BoxdClient | null>();

  constructor(
    private readonly host: BoxAgentsHost,
    private readonly socketDir: string,
  ) {}

  /** The host-side socket of a box's boxd. */
  socketPath(boxId: string): string {
    return path.join(this.socketDir, `${this.host.containerId(boxId)}.sock`);
  }

  /** Recorded as a box starts: boxd or not (`runsBoxd`). */
  started(boxId: string, runsBoxd: boolean): void {
    this.agents.set(boxId, runsBoxd ? new BoxdClient(this.socketPath(boxId)) : null);
  }

  /** Forgotten as a box's container is removed. */
  removed(boxId: string): void {
    this.agents.delete(boxId);
  }

  /** The box's boxd, or null when its PID 1 is not boxd (a box started before boxd). */
  async agent(boxId: string): Promise<BoxdClient | null> {
    const known = this.agents.get(boxId);
    if (known !== undefined) return known;
    let found: BoxdClient | null = null;
    const config = path.join(this.host.bundlePath(boxId), 'config.json');
    try {
      if (JSON.parse(await fs.promises.readFile(config, 'utf8')).process?.args?.[0] === BOX_BOXD) found = new BoxdClient(this.socketPath(boxId));
    } catch {
      /* no bundle: no container either */
    }
    if (found || fs.existsSync(config)) this.agents.set(boxId, found);
    return found;
  }

  async services(boxId: string): Promise<BoxServices> {
    const { agent, explain } = await this.needAgent(boxId, 'services');
    const s = new BoxdServices(agent);
    return {
      start: (spec) => explain(s.start(spec)),
      resume: (name) => explain(s.resume(name)),
      restart: (name) => explain(s.restart(name)),
      stop: (name, opts) => explain(s.stop(name, opts)),
      get: (name) => explain(s.get(name)),
      list: () => explain(s.list()),
      remove: (name) => explain(s.remove(name)),
      logs: (name, opts) => explain(s.logs(name, opts)),
      probe: (p) => explain(s.probe(p)),
    };
  }

  async files(boxId: string): Promise<BoxFiles> {
    const { agent, explain } = await this.needAgent(boxId, 'files');
    return {
      stat: (p) => explain(agent.stat(p)),
      list: (p) => explain(agent.list(p)),
      read: (p) => explain(agent.read(p)),
      write: (p, data, opts) => explain(agent.write(p, data, opts)),
      remove: (p, opts) => explain(agent.remove(p, opts)),
    };
  }

  async probe(boxId: string, timeoutMs: number): Promise<'ok' | 'none' | 'unresponsive' | 'unknown'> {
    if (!(await this.agent(boxId))) return 'none';
    try {
      await new BoxdClient(this.socketPath(boxId), timeoutMs).hello();
      return 'ok';
    } catch (e) {
      if ((await this.host.status(boxId).catch(() => null)) !== 'running') return 'none';
      // Only what boxd itself did counts: no answer in time, a broken answer, a socket nobody
      // listens on. A failure of the node's own (out of descriptors, say) says nothing of it.
      if (e instanceof BoxdUnreachableError) return ['ECONNREFUSED', 'ENOENT'].includes(e.code) ? 'unresponsive' : 'unknown';
      return e instanceof BoxAgentUnavailableError ? 'unresponsive' : 'unknown';
    }
  }

  /** A box whose boxd cannot be reached because the box is not running says so (409), not
   *  that its agent is down (503). */
  async explain(boxId: string, e: unknown): Promise<unknown> {
    if (e instanceof BoxdUnreachableError && (await this.host.status(boxId).catch(() => null)) !== 'running') {
      return new BoxNotRunningError('box is not running');
    }
    return e;
  }

  /** The box's boxd for a call that needs it (`what`: files, services), and a wrapper that
   *  explains its failures (a box that stopped meanwhile is 409, not an agent that is down). */
  private async needAgent(boxId: string, what: string): Promise<{ agent: BoxdClient; explain: <T>(p: Promise<T>) => Promise<T> }> {
    const agent = await this.agent(boxId);
    if (!agent) {
      if ((await this.host.status(boxId)) !== 'running') throw new BoxNotRunningError('box is not running');
      throw new BoxNeedsRestartError(`the box was started before its agent (boxd) existed: stop and resume it to use ${what}`);
    }
    const explain = async <T>(p: Promise<T>): Promise<T> => {
      try {
        return await p;
      } catch (e) {
        throw await this.explain(boxId, e);
      }
    };
    return { agent, explain };
  }
}
