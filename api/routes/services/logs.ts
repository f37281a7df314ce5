import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { streamText } from '../../http/textStream';
import { serviceLogs } from '../../../domain/services';
import { serviceErrors, serviceParams, ServiceParams } from './schemas';

export default defineRoute<unknown, { tail?: number; follow: boolean }, ServiceParams>({
  method: 'get',
  path: '/v1/projects/{project}/boxes/{name}/services/{service}/logs',
  summary: "A service's output (stdout and stderr, as written), its last `tail` lines; with `follow`, what it writes next, streamed",
  tag: 'services',
  params: serviceParams,
  query: Joi.object({
    tail: Joi.number().integer().min(0).max(10000).description('the last N lines (default 100; 0: none, only what comes next with follow)'),
    follow: Joi.boolean().truthy('1').falsy('0').default(false).description('keep the answer open and stream new output until the client closes it'),
  }),
  responses: { 200: { description: 'text/plain, streamed' }, ...serviceErrors },
  handler: async ({ api, identity, params, query, res }) => {
    const data = await serviceLogs(api, identity, params.project, params.name, params.service, { tail: query.tail, follow: query.follow });
    await streamText(res, data);
  },
});
