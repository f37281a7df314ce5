import { defineRoute } from '../../http/route';
import { operationHeaders } from '../../http/operation';
import { deleteVolume } from '../../../domain/volumes';
import { volumeErrors, volumeParams, VolumeParams } from './schemas';

export default defineRoute<unknown, unknown, VolumeParams>({
  method: 'delete',
  path: '/v1/data/{name}',
  summary: 'Delete a data volume with its snapshots and backups',
  tag: 'data',
  params: volumeParams,
  responses: {
    204: { description: 'deleted' },
    202: { description: 'still being deleted after 30 s: poll GET /v1/operations/{Operation-Id}' },
    403: { description: 'a volume of no project, asked by a project-limited token' },
    409: { description: 'attached to a box (named), or still being made' },
    ...volumeErrors,
  },
  handler: async ({ api, identity, params }) => {
    const r = await deleteVolume(api, identity, params.name);
    return 'done' in r ? { status: 204 } : { status: 202, headers: operationHeaders(r.accepted.operation) };
  },
});
