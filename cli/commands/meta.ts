import type { Command } from 'commander';
import type { Health, VersionInfo } from '../../core/apiTypes';
import { clientVersion } from '../client';
import { action } from '../context';
import { printFields, say } from '../output';

export function register(program: Command): void {
  program
    .command('version')
    .description('show the version of this client and of the server (GET /version)')
    .action(
      action(async (ctx) => {
        const { body } = await ctx.client.get<VersionInfo>('/version');
        ctx.show(body, (v) =>
          printFields([
            ['client', clientVersion()],
            ['server', v.version],
            ['commit', v.commit],
            ['api', v.api_version],
            ['url', ctx.client.endpoint.url],
          ]),
        );
      }),
    );

  program
    .command('health')
    .description('show the health of the server and what it depends on (GET /healthz); exits 1 when degraded')
    .action(
      action(async (ctx) => {
        const res = await ctx.client.get<Health>('/healthz', { accept: [503] });
        ctx.show(res.body, (h) => {
          say(`status: ${h.status}`);
          for (const [k, v] of Object.entries(h.checks ?? {})) {
            if (v && typeof v === 'object') for (const [n, s] of Object.entries(v)) say(`  ${k.replace(/s$/, '')} ${n}: ${s}`);
            else say(`  ${k}: ${v}`);
          }
        });
        if (res.status !== 200) ctx.exit(1);
      }),
    );

  program
    .command('openapi')
    .description('list the API\'s routes, one per line (GET /openapi.json); --json prints the whole OpenAPI 3.1 document')
    .action(
      action(async (ctx) => {
        const { body } = await ctx.client.get<{ paths: Record<string, Record<string, { summary?: string }>> }>('/openapi.json');
        ctx.show(body, (doc) => {
          for (const [p, methods] of Object.entries(doc.paths)) {
            for (const [m, op] of Object.entries(methods)) say(`${m.toUpperCase().padEnd(6)} ${p}  ${op.summary ?? ''}`);
          }
        });
      }),
    );
}
