import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { deleteFile } from '../../../domain/files';
import { boxParams, BoxParams, fileChangeErrors, pathQuery } from './schemas';

export default defineRoute<unknown, { path: string; recursive: boolean }, BoxParams>({
  method: 'delete',
  path: '/v1/projects/{project}/boxes/{name}/files',
  summary: 'Deletes a file, link or empty directory in a running box (`recursive`: a whole tree)',
  tag: 'files',
  params: boxParams,
  query: Joi.object({ path: pathQuery, recursive: Joi.boolean().default(false) }),
  responses: { 204: { description: 'deleted' }, ...fileChangeErrors, 400: { description: 'a relative path, the root, or a directory that is not empty without `recursive`' } },
  handler: async ({ api, identity, params, query }) => {
    await deleteFile(api, identity, params.project, params.name, query.path, query.recursive);
    return { status: 204 };
  },
});
