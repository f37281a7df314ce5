import { spawn, ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import IORedis, { RedisOptions } from 'ioredis';
import type { Config } from './config';
import type { Logger } from './logger';
import { sleep } from './command';

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

  constructor(private readonly config: Config, private readonly log: Logger) {}

  async start(): Promise<void> {
    if (this.config.redisUrl) return;
    const socket = embeddedRedisSocket(this.config);
    if (await answersPing(socket)) return;
    const dir = path.dirname(socket);
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    fs.rmSync(socket, { force: true });
    this.child = spawn('redis-server', [
      '--port', '0', '--unixsocket', socket, '--unixsocketperm', '700', '--dir', dir,
      '--appendonly', 'yes', '--save', '', '--daemonize', 'no', '--logfile', path.join(dir, 'redis.log'),
    ], { stdio: 'ignore' });
    this.child.on('exit', (code) => this.log.warn({ code }, 'embedded redis-server exited'));
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
    const child = this.child;
    if (!child || child.exitCode !== null) return;
    await new Promise<void>((resolve) => {
      child.once('exit', () => resolve());
      child.kill('SIGTERM');
    });
  }
}
