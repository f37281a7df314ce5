import { defineRoute } from '../../http/route';
import { operationHeaders } from '../../http/operation';
import { deleteDataSnapshot } from '../../../domain/volumeData';
import { volumeErrors, volumeSnapshotParams, VolumeSnapshotParams } from './schemas';

export default defineRoute<unknown, unknown, VolumeSnapshotParams>({
  method: 'delete',
  path: '/v1/data/{name}/snapshots/{snapshot}',
  summary: 'Delete a snapshot of a data volume',
  tag: 'data',
  params: volumeSnapshotParams,
  responses: { 204: { description: 'deleted' }, 202: { description: 'still being deleted after 30 s' }, 409: { description: 'a queued restore goes to it' }, ...volumeErrors },
  handler: async ({ api, identity, params }) => {
    const r = await deleteDataSnapshot(api, identity, params.name, params.snapshot);
    return 'done' in r ? { status: 204 } : { status: 202, headers: operationHeaders(r.accepted.operation) };
  },
});
