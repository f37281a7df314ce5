import fs from 'node:fs';
import path from 'node:path';
import { PassThrough, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Command } from 'commander';
import * as tar from 'tar';
import type { FileList, FileStat } from '../../core/apiTypes';
import { apiPath, UsageError } from '../client';
import { action, Ctx, localStat, projectOption } from '../context';
import { printTable, say, transferProgress as progress } from '../output';
import { openSession } from '../session';

const boxPath = (ctx: Ctx, project: string | undefined, box: string) => apiPath('v1', 'projects', ctx.project(project), 'boxes', box);
const filesPath = (ctx: Ctx, project: string | undefined, box: string) => `${boxPath(ctx, project, box)}/files`;

/** `BOX:/path` → {box, path}; anything else is a local path. */
function remote(spec: string): { box: string; path: string } | null {
  const m = /^([a-z0-9][a-z0-9-]{0,62}):(\/.*)$/.exec(spec);
  return m ? { box: m[1], path: m[2] } : null;
}


const showStat = (st: FileStat) => `${st.mode} ${st.type.padEnd(7)} ${String(st.size).padStart(10)} ${st.mtime} ${st.path}${st.target ? ` -> ${st.target}` : ''}`;

export function register(program: Command): void {
  projectOption(
    program
      .command('cp <source> <destination>')
      .description('copy a file or directory into or out of a running box: box cp ./f web:/tmp/f, box cp web:/etc/hostname .'),
  )
    .option('--mode <octal>', 'mode of an uploaded file (default: the local file\'s)')
    .addHelpText('after', '\nFiles stream through the files API; directories travel as a tar stream (tar in the box, over WebSocket exec).')
    .action(
      action<{ project?: string; mode?: string }>(async (ctx, [src, dst], o) => {
        const from = remote(src);
        const to = remote(dst);
        if (!!from === !!to) throw new UsageError('one side of box cp is BOX:/absolute/path and the other a local path');
        if (to) {
          const st = localStat(src);
          if (st.isDirectory()) {
            // A directory: a tar of it, unpacked by tar in the box.
            const q = new URLSearchParams();
            for (const c of ['sh', '-c', 'mkdir -p "$1" && exec tar -x -C "$1"', 'box-cp', to.path]) q.append('command', c);
            const session = await openSession(ctx.client, `${boxPath(ctx, o.project, to.box)}/exec/ws`, q);
            // The entries, not `.`: tar in the box would give the target directory itself the
            // source's owner and mode.
            const stream = tar.c({ cwd: src, portable: true }, fs.readdirSync(src));
            let localFailure: Error | undefined;
            const pumped = (async () => {
              try {
                for await (const b of stream.pipe(progress(`${src} → ${dst}`))) {
                  session.stdin(b as Buffer);
                  // Back-pressure: no more than 4 MiB waits in the socket.
                  while (session.ws.bufferedAmount > 4 << 20) await new Promise((r) => setTimeout(r, 5));
                }
              } catch (e) {
                localFailure = e as Error;
                session.signal('TERM');
              } finally {
                session.endStdin();
              }
            })();
            let err = '';
            const code = await session.run({ stdout: () => undefined, stderr: (b) => void (err += b.toString()) });
            await pumped;
            if (localFailure) throw new Error(`reading ${src} failed: ${localFailure.message}`);
            if (code !== 0) throw new Error(`tar in the box failed (exit ${code}): ${err.trim()}`);
            return;
          }
          const target = to.path.endsWith('/') ? path.posix.join(to.path, path.basename(src)) : to.path;
          const mode = o.mode ?? (st.mode & 0o7777).toString(8).padStart(4, '0');
          const res = await ctx.client.stream('PUT', filesPath(ctx, o.project, to.box), { path: target, mode }, fs.createReadStream(src).pipe(progress(`${src} → ${to.box}:${target}`, st.size)));
          const chunks: Buffer[] = [];
          for await (const c of res) chunks.push(c as Buffer);
          const stat = JSON.parse(Buffer.concat(chunks).toString()) as FileStat;
          ctx.show(stat, () => undefined);
          return;
        }
        const f = from!;
        const stat = (await ctx.client.get<FileStat>(`${filesPath(ctx, o.project, f.box)}/stat`, { query: { path: f.path } })).body;
        let local = dst;
        if (fs.existsSync(dst) && fs.statSync(dst).isDirectory()) local = path.join(dst, path.posix.basename(f.path));
        if (stat.type === 'dir') {
          fs.mkdirSync(local, { recursive: true });
          const q = new URLSearchParams();
          for (const c of ['tar', '-c', '-C', f.path, '.']) q.append('command', c);
          const session = await openSession(ctx.client, `${boxPath(ctx, o.project, f.box)}/exec/ws`, q);
          session.endStdin();
          const through = new PassThrough();
          const extracted = pipeline(through, progress(`${src} → ${local}`), tar.x({ cwd: local, strict: true }));
          let extractFailure: Error | undefined;
          extracted.catch((e: Error) => {
            extractFailure = e;
            session.signal('TERM');
            session.drain(); // what still comes is dropped: read on to the status
          });
          let err = '';
          // The unpacking's pace is the box's: the socket is read no faster than tar takes it.
          through.on('drain', () => session.drain());
          const code = await session.run({ stdout: (b) => extractFailure !== undefined || through.write(b), stderr: (b) => void (err += b.toString()) });
          through.end();
          await extracted.catch(() => undefined);
          if (extractFailure) throw new Error(`unpacking into ${local} failed: ${extractFailure.message}`);
          if (code !== 0) throw new Error(`tar in the box failed (exit ${code}): ${err.trim()}`);
          return;
        }
        const res = await ctx.client.stream('GET', filesPath(ctx, o.project, f.box), { path: f.path });
        await pipeline(res, progress(`${src} → ${local}`, stat.size), fs.createWriteStream(local, { mode: parseInt(stat.mode, 8) & 0o777 }));
      }),
    );

  projectOption(program.command('cat <file>').description('print a file of a running box: box cat web:/etc/hostname')).action(
    action<{ project?: string }>(async (ctx, [spec], o) => {
      const f = remote(spec);
      if (!f) throw new UsageError('box cat takes BOX:/absolute/path');
      await pipeline(await ctx.client.stream('GET', filesPath(ctx, o.project, f.box), { path: f.path }), process.stdout);
    }),
  );

  const files = program.command('files').description('look at and remove files in a running box (the files API)');
  projectOption(files.command('ls <box> [path]').description('list a directory (default /)')).action(
    action<{ project?: string }>(async (ctx, [box, p], o) => {
      const { body } = await ctx.client.get<FileList>(`${filesPath(ctx, o.project, box)}/list`, { query: { path: p ?? '/' } });
      ctx.show(body, (b) => {
        printTable(['MODE', 'TYPE', 'SIZE', 'MTIME', 'NAME'], b.entries.map((e) => [e.mode, e.type, String(e.size), e.mtime, e.target ? `${e.name} -> ${e.target}` : e.name]));
        if (b.truncated) say('(more entries than a listing answers: cut)');
      });
    }),
  );
  projectOption(files.command('stat <box> <path>').description('what a path is (a link is told, not followed)')).action(
    action<{ project?: string }>(async (ctx, [box, p], o) => {
      const { body } = await ctx.client.get<FileStat>(`${filesPath(ctx, o.project, box)}/stat`, { query: { path: p } });
      ctx.show(body, (b) => say(showStat(b)));
    }),
  );
  projectOption(files.command('rm <box> <path>').description('delete a file, link or empty directory'))
    .option('-r, --recursive', 'a whole tree')
    .action(
      action<{ project?: string; recursive?: boolean }>(async (ctx, [box, p], o) => {
        await ctx.client.delete(filesPath(ctx, o.project, box), { query: { path: p, recursive: o.recursive ? true : undefined } });
      }),
    );
}


