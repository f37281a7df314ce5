import { pipeline } from 'node:stream/promises';
import { defineRoute } from '../../http/route';
import { exportBase } from '../../../domain/bases';
import { baseErrors, baseParams, BaseParams } from './schemas';

export default defineRoute<unknown, unknown, BaseParams>({
  method: 'get',
  path: '/v1/bases/{name}/export',
  summary: "A base's root filesystem as a plain tar stream (entries at the tar root, as `docker export` writes them)",
  tag: 'bases',
  params: baseParams,
  responses: { 200: { description: 'application/x-tar, streamed' }, ...baseErrors },
  handler: async ({ api, identity, params, res }) => {
    const { base, data } = await exportBase(api, identity, params.name);
    res.status(200);
    res.setHeader('content-type', 'application/x-tar');
    res.setHeader('content-disposition', `attachment; filename="${base.name}-${base.version}.tar"`);
    // A failure mid-way can only cut the body: the status went out with the first byte.
    await pipeline(data, res).catch(() => res.destroy());
  },
});
