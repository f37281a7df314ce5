import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listFiles } from '../../../domain/files';
import { boxParams, BoxParams, fileErrors, fileStatSchema, pathQuery } from './schemas';

export default defineRoute<unknown, { path: string }, BoxParams>({
  method: 'get',
  path: '/v1/projects/{project}/boxes/{name}/files/list',
  summary: 'The entries of a directory in a running box, by name',
  tag: 'files',
  params: boxParams,
  query: Joi.object({ path: pathQuery }),
  responses: {
    200: { description: 'its entries (at most 5000; `truncated` says when there were more)', schema: Joi.object({ entries: Joi.array().items(fileStatSchema), truncated: Joi.boolean() }) },
    ...fileErrors,
  },
  handler: async ({ api, identity, params, query }) => ({ body: await listFiles(api, identity, params.project, params.name, query.path) }),
});
