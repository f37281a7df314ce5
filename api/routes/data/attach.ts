import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { attachVolume } from '../../../domain/volumes';
import type { AttachDataRequest } from '../../../core/apiTypes';
import { boxSchema } from '../boxes/schemas';
import { mountPath, projectBox, volumeErrors, volumeParams, VolumeParams } from './schemas';

export default defineRoute<AttachDataRequest, unknown, VolumeParams>({
  method: 'post',
  path: '/v1/data/{name}/attach',
  summary: 'Attach a data volume to a box at an absolute path; it is bound in at the box\'s next start (a running box: stop and resume it)',
  tag: 'data',
  params: volumeParams,
  body: Joi.object({ ...projectBox, path: mountPath().required(), read_only: Joi.boolean().default(false) }),
  responses: {
    200: { description: 'the box, its data_mounts showing the volume', schema: boxSchema },
    400: { description: 'a path that is not absolute, is one of / /proc /sys /dev /run /etc /volumes /home /box (also as /etc/ or /./etc), is under /.boxhost, or overlaps another mount of the box' },
    404: { description: 'no such volume or box' },
    409: { description: 'already attached to this box; the volume is of another project or on another node than the box; being made or deleted; the box is being deleted' },
    429: { description: "the box's project has no room for the volume in its quotas (its first attach)" },
  },
  handler: async ({ api, identity, params, body }) => ({ status: 200, body: await attachVolume(api, identity, params.name, body) }),
});

export { volumeErrors };
