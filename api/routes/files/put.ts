import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { writeFile } from '../../../domain/files';
import { boxParams, BoxParams, fileChangeErrors, fileStatSchema, pathQuery } from './schemas';

export default defineRoute<unknown, { path: string; mode?: string }, BoxParams>({
  method: 'put',
  path: '/v1/projects/{project}/boxes/{name}/files',
  summary: 'Writes a whole file in a running box from the raw body, streamed (parents made)',
  tag: 'files',
  params: boxParams,
  query: Joi.object({
    path: pathQuery,
    mode: Joi.string().pattern(/^[0-7]{1,4}$/).description('octal, e.g. "0644" (default 0644 for a new file)').messages({ 'string.pattern.base': 'must be octal digits, at most four ("0644", "4755")' }),
  }),
  rawBody: true,
  responses: {
    200: { description: 'the file as written', schema: fileStatSchema },
    ...fileChangeErrors,
    507: { description: "the box's disk is full: nothing is left at the path (an old file stays as it was)" },
  },
  handler: async ({ api, identity, params, query, req }) => ({ body: await writeFile(api, identity, params.project, params.name, query.path, req, query.mode) }),
});
