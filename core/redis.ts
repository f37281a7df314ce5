import { spawn, ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import IORedis, { RedisOptions } from 'ioredis';
import type { Config } from './config';
import type { Logger } from './logger';
import { sleep } from './command';
import { processStamp, stampedProcess } from './procStamp';

/** Connection options for every ioredis client of this host (BullMQ needs
 *  maxRetriesPerRequest null on its blocking connections). */
export function redisOptions(config: Config): RedisOptions {
  const base: RedisOptions = { maxRetriesPerRequest: null, enableReadyCheck: true, lazyConnect: false };
  if (!config.redisUrl) return { ...base, path: embeddedRedisSocket(config) };
  const url = new URL(config.redisUrl);
  if (url.protocol === 'unix:') return { ...base, path: url.pathname };
  return {
    ...base,
    host: url.hostname,
    port: Number(url.port || 6379),
    username: url.username || undefined,
    password: url.password ? decodeURIComponent(url.password) : undefined,
    db: url.pathname.length > 1 ? Number(url.pathname.slice(1)) : 0,
    tls: url.protocol === 'rediss:' ? {} : undefined,
  };
}

export const embeddedRedisSocket = (config: Config) => path.join(config.dataDir, 'redis', 'redis.sock');

/** Key prefix of the cluster's queues (BOXHOST_REDIS_PREFIX): the api and every node share
 *  it; installations sharing one Redis set different ones. */
export const queuePrefix = (config: Config) => config.redisPrefix;

async function answersPing(socket: string): Promise<boolean> {
  if (!fs.existsSync(socket)) return false;
  const client = new IORedis({ path: socket, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  client.on('error', () => undefined);
  try {
    await client.connect();
    return (await client.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

/**
 * With no REDIS_URL the host runs its own redis-server on a unix socket in the data dir, so one
 * command starts a working host. Its append-only file keeps queued jobs across restarts. When
 * another process of this host (api and worker run apart) already started it, it is reused.
 */
export class EmbeddedRedis {
  private child?: ChildProcess;
  /** An orphan taken over at start (its starter was killed): stopped by this process. */
  private adopted?: number;

  constructor(private readonly config: Config, private readonly log: Logger) {}

  async start(): Promise<void> {
    if (this.config.redisUrl) return;
    const socket = embeddedRedisSocket(this.config);
    if (await answersPing(socket)) {
      // Started by a process of this host that still runs: theirs to stop. Started by one that
      // was killed (kill -9 leaves the server running): this process takes it over, and stops it
      // when it stops, as it would one it started.
      this.adopted = takeOver(socket);
      if (this.adopted !== undefined) this.log.info({ socket, pid: this.adopted }, 'embedded redis-server left by a killed process: taken over');
      return;
    }
    const dir = path.dirname(socket);
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    fs.rmSync(socket, { force: true });
    this.child = spawn('redis-server', [
      '--port', '0', '--unixsocket', socket, '--unixsocketperm', '700', '--dir', dir,
      '--appendonly', 'yes', '--save', '', '--daemonize', 'no', '--logfile', path.join(dir, 'redis.log'),
      // A group of its own: the terminal's Ctrl-C reaches the host, which stops it last (after
      // the running operations it holds have finished), not it at once.
    ], { stdio: 'ignore', detached: true });
    this.child.on('exit', (code) => this.log.warn({ code }, 'embedded redis-server exited'));
    if (this.child.pid) writeStarter(socket, this.child.pid);
    for (let i = 0; i < 100; i++) {
      if (await answersPing(socket)) {
        this.log.info({ socket }, 'embedded redis-server started');
        return;
      }
      await sleep(50);
    }
    throw new Error(`embedded redis-server did not start (see ${path.join(dir, 'redis.log')})`);
  }

  async stop(): Promise<void> {
    if (this.adopted !== undefined) {
      const pid = this.adopted;
      this.adopted = undefined;
      try {
        process.kill(pid, 'SIGTERM');
      } catch {
        return; // gone already
      }
      for (let i = 0; i < 100 && alive(pid); i++) await sleep(50);
      return;
    }
    const child = this.child;
    if (!child || child.exitCode !== null) return;
    await new Promise<void>((resolve) => {
      child.once('exit', () => resolve());
      child.kill('SIGTERM');
    });
  }
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** `<socket dir>/starter`: which redis-server serves the socket and which process started it. */
const starterFile = (socket: string) => path.join(path.dirname(socket), 'starter');

function writeStarter(socket: string, redisPid: number): void {
  fs.writeFileSync(starterFile(socket), `${JSON.stringify({ redis: processStamp(redisPid), starter: processStamp() })}\n`, { mode: 0o600 });
}

/** The pid of the redis-server serving `socket` when the process that started it is gone (the
 *  file then names this process as its starter), else undefined: its starter runs, or nothing
 *  says which server it is. Processes of one host starting together (api and workers after a
 *  kill -9) take turns through `<socket dir>/takeover`, so only the first takes it over: the
 *  others then find a starter that runs. */
function takeOver(socket: string): number | undefined {
  const lock = path.join(path.dirname(socket), 'takeover');
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      fs.writeFileSync(lock, processStamp(), { flag: 'wx', mode: 0o600 });
    } catch {
      // Held: by a process under way (not ours to take), or by one that died holding it.
      let holder: string;
      try {
        holder = fs.readFileSync(lock, 'utf8');
      } catch {
        continue; // released meanwhile
      }
      if (stampedProcess(holder) !== null) return undefined;
      fs.rmSync(lock, { force: true });
      continue;
    }
    try {
      const f = JSON.parse(fs.readFileSync(starterFile(socket), 'utf8')) as { redis: string; starter: string };
      const redis = stampedProcess(f.redis);
      if (redis === null || stampedProcess(f.starter) !== null) return undefined;
      fs.writeFileSync(starterFile(socket), `${JSON.stringify({ redis: f.redis, starter: processStamp() })}\n`, { mode: 0o600 });
      return redis;
    } catch {
      return undefined;
    } finally {
      fs.rmSync(lock, { force: true });
    }
  }
  return undefined;
}
