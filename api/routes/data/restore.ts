import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { operationHeaders, waitQuery } from '../../http/operation';
import { restoreVolume } from '../../../domain/volumeData';
import type { RestoreDataRequest } from '../../../core/apiTypes';
import { BoxhostError } from '../../../core/errors';
import { NODE_ID_PATTERN } from '../nodes/schemas';
import { volumeErrors, volumeParams, VolumeParams, volumeSchema } from './schemas';

export default defineRoute<RestoreDataRequest, { wait?: number }, VolumeParams>({
  method: 'post',
  path: '/v1/data/{name}/restore',
  summary: 'Restore a data volume to one of its snapshots or backups (a backup is checked against its sha256 first; a corrupt one fails and the volume is untouched)',
  tag: 'data',
  params: volumeParams,
  query: Joi.object(waitQuery),
  body: Joi.object({
    snapshot: name(),
    backup: name(),
    node: Joi.string().pattern(NODE_ID_PATTERN).description('restore the backup on this node, which then holds the volume (a move; the backup directory must be shared by both nodes)'),
  }).xor('snapshot', 'backup').with('node', 'backup'),
  responses: {
    202: { description: 'accepted: the volume; poll the operation', schema: volumeSchema },
    200: { description: 'with ?wait: the volume once restored', schema: volumeSchema },
    400: { description: 'both or neither of snapshot and backup; node without backup' },
    403: { description: 'node given by a token limited to projects (moves are the operator\'s)' },
    507: { description: 'the target node has no room for the volume' },
    409: { description: 'a box with the volume attached runs; later snapshots would be lost (named); the backup is not completed; with ?wait: the backup was corrupt or missing (the volume untouched)' },
    ...volumeErrors,
    404: { description: 'no such data volume (or not one this token may see), backup, or node' },
    503: { description: "the node that is to do the restore (the volume's, or the one named) is not answering" },
  },
  handler: async ({ api, identity, params, body, query }) => {
    const accepted = await restoreVolume(api, identity, params.name, body);
    const headers = operationHeaders(accepted.operation);
    if (query.wait) {
      const done = await api.queue.waitFor(accepted.operation.id, query.wait * 1000);
      if (done?.status === 'failed') {
        const refused = /corrupt|missing from the backup|attached to box|only a completed|moved meanwhile/.test(done.error ?? '');
        throw new BoxhostError(refused ? 'conflict' : 'internal', `the restore failed: ${done.error ?? 'its operation failed'} (operation ${accepted.operation.id})`, [], headers);
      }
      if (done?.status === 'succeeded') return { status: 200, body: (await accepted.load()) ?? undefined, headers };
    }
    return { status: 202, body: (await accepted.load()) ?? undefined, headers };
  },
});
