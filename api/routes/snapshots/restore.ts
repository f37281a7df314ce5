import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { acceptedReply, waitQuery } from '../../http/operation';
import { restoreSnapshot } from '../../../domain/snapshots';
import { acceptedResponses } from '../boxes/schemas';
import { snapshotErrors, snapshotParams, SnapshotParams } from './schemas';

export default defineRoute<unknown, { wait?: number }, SnapshotParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/snapshots/{snapshot}/restore',
  summary: 'Bring a box back to a snapshot: it stops, its root rolls back, it runs again with the snapshot\'s files',
  tag: 'snapshots',
  params: snapshotParams,
  query: Joi.object(waitQuery),
  body: Joi.object({}).description('nothing: a field here is refused (400), not ignored'),
  responses: {
    ...acceptedResponses,
    409: { description: 'the box is not running or stopped; snapshots or forks made after this snapshot would be lost (named in the message and details)' },
    ...snapshotErrors,
  },
  handler: async ({ api, identity, params, query }) => acceptedReply(api, await restoreSnapshot(api, identity, params.project, params.name, params.snapshot), query.wait),
});
