import { defineRoute } from '../../http/route';
import { deleteSnapshot } from '../../../domain/snapshots';
import { snapshotErrors, snapshotParams, SnapshotParams } from './schemas';

export default defineRoute<unknown, unknown, SnapshotParams>({
  method: 'delete',
  path: '/v1/projects/{project}/boxes/{name}/snapshots/{snapshot}',
  summary: 'Delete a snapshot of a box (boxes forked from it keep working)',
  tag: 'snapshots',
  params: snapshotParams,
  responses: { 204: { description: 'deleted' }, 409: { description: 'a queued restore goes to it' }, ...snapshotErrors },
  handler: async ({ api, identity, params }) => {
    await deleteSnapshot(api, identity, params.project, params.name, params.snapshot);
    return { status: 204 };
  },
});
