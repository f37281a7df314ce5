import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { streamText } from '../../http/textStream';
import { buildLog } from '../../../domain/baseBuilds';
import { buildParams, BuildParams } from './schemas';

export default defineRoute<unknown, { follow: boolean }, BuildParams>({
  method: 'get',
  path: '/v1/base-builds/{id}/logs',
  summary: "A base build's output (stdout and stderr of its script, as written); with `follow`, streamed until the build ends",
  tag: 'bases',
  params: buildParams,
  query: Joi.object({ follow: Joi.boolean().truthy('1').falsy('0').default(false) }),
  responses: { 200: { description: 'text/plain, streamed' }, 404: { description: 'no such build' } },
  handler: async ({ api, identity, params, query, res }) => {
    const data = await buildLog(api, identity, params.id, query.follow);
    await streamText(res, data);
  },
});
