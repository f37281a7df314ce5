import { defineRoute } from '../../http/route';
import { getSnapshot } from '../../../domain/snapshots';
import { snapshotErrors, snapshotParams, SnapshotParams, snapshotSchema } from './schemas';

export default defineRoute<unknown, unknown, SnapshotParams>({
  method: 'get',
  path: '/v1/projects/{project}/boxes/{name}/snapshots/{snapshot}',
  summary: 'One snapshot of a box',
  tag: 'snapshots',
  params: snapshotParams,
  responses: { 200: { description: 'the snapshot', schema: snapshotSchema }, ...snapshotErrors },
  handler: async ({ api, identity, params }) => ({ body: await getSnapshot(api, identity, params.project, params.name, params.snapshot) }),
});
