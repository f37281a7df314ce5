import fs from 'node:fs';
import { pipeline } from 'node:stream/promises';
import type { Command } from 'commander';
import type { Base, BaseList, Operation } from '../../core/apiTypes';
import { apiPath, UsageError } from '../client';
import { action, Ctx, localStat, projectOption } from '../context';
import { OperationFailed, pollOperation } from '../jobs';
import { registerUnderBase } from './builds';
import { formatBytes, formatTime, printFields, printTable, say, transferProgress } from '../output';

const basePath = (spec: string) => `/v1/bases/${encodeURIComponent(spec).replace('%40', '@')}`;

const showBase = (b: Base) =>
  printFields([
    ['name', b.name],
    ['version', b.version ?? ''],
    ['origin', b.origin],
    ['project', b.project ?? '(every project)'],
    ['created', formatTime(b.created_at)],
    ['size', formatBytes(b.size_bytes)],
    ['builder', b.builder],
    ['parent', b.parent ?? (b.parent_alias ? `${b.parent_alias}${b.parent_version ? `@${b.parent_version}` : ''}` : null)],
    ['script sha256', b.script_sha256],
  ]);

/** Follows a save or import to its end (progress on stderr), then shows the base it made. */
async function follow(ctx: Ctx, opId: string | undefined, spec: string, what: string, wait: boolean, answered: Base): Promise<void> {
  if (!wait || !opId) {
    return ctx.show(answered, (b) => {
      say(`${what} ${b.name}@${b.version}: accepted`);
      if (opId) say(`operation: ${opId} (follow it with: box op wait ${opId})`);
    });
  }
  const label = { doing: what, done: `${what}`, what: spec };
  const op: Operation = await pollOperation(ctx, opId, label);
  if (op.status === 'failed') throw new OperationFailed(op, label);
  ctx.show((await ctx.client.get<Base>(basePath(spec))).body, showBase);
}

/** `box base ls|get|save|build|import|export|rm` (docs/bases.md). */
export function register(program: Command): void {
  const base = program.command('base').description('bases boxes are made from: list, save a box as one, build one, import and export tarballs, delete');
  registerUnderBase(base);

  base.command('ls').alias('list').description('every base version, newest first within a name').action(
    action(async (ctx) => {
      const { body } = await ctx.client.get<BaseList>('/v1/bases');
      ctx.show(body, (l) =>
        printTable(['NAME', 'VERSION', 'ORIGIN', 'PROJECT', 'SIZE', 'CREATED'], l.bases.map((b) => [b.name, b.version ?? '', b.origin, b.project ?? '-', formatBytes(b.size_bytes), formatTime(b.created_at)]), 'no bases'),
      );
    }),
  );

  base.command('get <base>').description('one base: NAME (its newest version) or NAME@VERSION').action(
    action(async (ctx, [spec]) => ctx.show((await ctx.client.get<Base>(basePath(spec))).body, showBase)),
  );

  projectOption(base.command('save <box> <name>').description("save a box's files as a new version of base NAME (a running box is paused for the instant): box base save web web-base; BOX may be PROJECT/BOX"))
    .option('--builder <text>', 'who or what made it (kept with the base)')
    .option('--script <file>', 'the script that built it (kept with the base)')
    .option('--parent <base>', 'the base it was built from (NAME or NAME@VERSION)')
    .option('--no-wait', 'answer at once instead of following the save')
    .action(
      action<{ project?: string; builder?: string; script?: string; parent?: string; wait: boolean }>(async (ctx, [boxSpec, name], o) => {
        const [project, box] = boxSpec.includes('/') ? boxSpec.split('/') : [ctx.project(o.project), boxSpec];
        const script = o.script === undefined ? undefined : fs.readFileSync(o.script, 'utf8');
        const [parentAlias, parentVersion] = (o.parent ?? '').split('@');
        const body = { box, name, builder: o.builder, script, parent_alias: parentAlias || undefined, parent_version: parentVersion || undefined };
        const r = await ctx.client.request<Base>('POST', apiPath('v1', 'projects', project, 'bases'), { body });
        await follow(ctx, r.headers['operation-id'] as string | undefined, `${name}@${r.body.version}`, 'saving', o.wait, r.body);
      }),
    );

  base.command('import <file>').description('import a base from a tar or tar.gz file ("-": stdin): box base import rootfs.tar.gz --name mybase')
    .requiredOption('--name <name>', 'the base name')
    .option('--builder <text>', 'who or what made it (kept with the base)')
    .option('-p, --project <project>', "make it this project's base, seen and used only there (default: a project-limited token's first project; a token without a limit: every project's)")
    .option('--no-wait', 'answer at once instead of following the import')
    .action(
      action<{ name: string; builder?: string; project?: string; wait: boolean }>(async (ctx, [file], o) => {
        const size = file === '-' ? undefined : localFileSize(file);
        const input = file === '-' ? process.stdin : fs.createReadStream(file);
        const res = await ctx.client.stream('POST', '/v1/bases/import', { name: o.name, builder: o.builder, project: o.project }, input.pipe(transferProgress(`uploading ${file}`, size)));
        const chunks: Buffer[] = [];
        for await (const c of res) chunks.push(c as Buffer);
        const answered = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Base;
        await follow(ctx, res.headers['operation-id'] as string | undefined, `${answered.name}@${answered.version}`, 'importing', o.wait, answered);
      }),
    );

  base.command('export <base>').description('write a base as a plain tar: box base export web -o web.tar (default: stdout)')
    .option('-o, --output <file>', 'the file to write')
    .action(
      action<{ output?: string }>(async (ctx, [spec], o) => {
        if (!o.output && process.stdout.isTTY) throw new UsageError('refusing to write a tar to a terminal: give -o FILE or redirect stdout');
        const res = await ctx.client.stream('GET', `${basePath(spec)}/export`, {});
        await pipeline(res, transferProgress(`exporting ${spec}`), o.output ? fs.createWriteStream(o.output) : process.stdout);
      }),
    );

  base.command('rm <base>').alias('delete').description('delete NAME@VERSION, or every version of NAME (refused while a box was made from one)').action(
    action(async (ctx, [spec]) => {
      await ctx.client.request('DELETE', basePath(spec));
      if (!ctx.json) say(`deleted base ${spec}`);
    }),
  );
}

/** The size of a file to upload (a plain error naming it when it is not one). */
function localFileSize(file: string): number {
  const st = localStat(file);
  if (!st.isFile()) throw new UsageError(`${file} is not a file`);
  return st.size;
}
