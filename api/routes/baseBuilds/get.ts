import { defineRoute } from '../../http/route';
import { getBuild, toApiBuild } from '../../../domain/baseBuilds';
import { buildParams, BuildParams, buildSchema } from './schemas';

export default defineRoute<unknown, unknown, BuildParams>({
  method: 'get',
  path: '/v1/base-builds/{id}',
  summary: 'A base build: queued → running → succeeded | failed',
  tag: 'bases',
  params: buildParams,
  responses: { 200: { description: 'the build', schema: buildSchema }, 404: { description: 'no such build (or not one this token may see)' } },
  handler: async ({ api, identity, params }) => ({ status: 200, body: toApiBuild(await getBuild(api, identity, params.id)) }),
});
