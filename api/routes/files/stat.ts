import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { statFile } from '../../../domain/files';
import { boxParams, BoxParams, fileErrors, fileStatSchema, pathQuery } from './schemas';

export default defineRoute<unknown, { path: string }, BoxParams>({
  method: 'get',
  path: '/v1/projects/{project}/boxes/{name}/files/stat',
  summary: 'What a path in a running box is (a link is told, not followed)',
  tag: 'files',
  params: boxParams,
  query: Joi.object({ path: pathQuery }),
  responses: { 200: { description: 'the stat', schema: fileStatSchema }, ...fileErrors },
  handler: async ({ api, identity, params, query }) => ({ body: await statFile(api, identity, params.project, params.name, query.path) }),
});
