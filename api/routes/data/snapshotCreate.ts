import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { operationHeaders } from '../../http/operation';
import { createDataSnapshot } from '../../../domain/volumeData';
import type { CreateDataSnapshotRequest } from '../../../core/apiTypes';
import { dataSnapshotSchema, snapshotDescription, volumeErrors, volumeParams, VolumeParams, volumeSchema } from './schemas';

export default defineRoute<CreateDataSnapshotRequest, unknown, VolumeParams>({
  method: 'post',
  path: '/v1/data/{name}/snapshots',
  summary: 'Snapshot a data volume; answers the snapshot, or 202 + operation past 30 s',
  tag: 'data',
  params: volumeParams,
  body: Joi.object({ name: name().required(), description: snapshotDescription() }),
  responses: {
    201: { description: 'taken', schema: dataSnapshotSchema },
    202: { description: 'still being taken after 30 s', schema: volumeSchema },
    400: { description: 'a bad name or description' },
    409: { description: 'the name is taken; the volume is being made or deleted; it has its most snapshots' },
    ...volumeErrors,
  },
  handler: async ({ api, identity, params, body }) => {
    const made = await createDataSnapshot(api, identity, params.name, body);
    if ('done' in made) return { status: 201, body: made.done };
    return { status: 202, body: (await made.accepted.load()) ?? undefined, headers: operationHeaders(made.accepted.operation) };
  },
});
