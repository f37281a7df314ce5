import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name, projectParam } from '../../http/schemas';
import { operationHeaders, waitQuery } from '../../http/operation';
import { getBuild, startBuild, toApiBuild } from '../../../domain/baseBuilds';
import type { StartBaseBuildRequest } from '../../../core/apiTypes';
import { buildSchema, buildStartSchema } from './schemas';

export default defineRoute<StartBaseBuildRequest, { wait?: number }>({
  method: 'post',
  path: '/v1/base-builds',
  summary: 'Build a base: run `script` as root in a temporary box from `parent`, save it as `base` (version: first 12 hex of sha256("<parent>@<version>\\n<script>")); a version that exists is cached unless force',
  tag: 'bases',
  query: Joi.object(waitQuery),
  body: Joi.object({
    base: name(),
    parent: Joi.string().max(200).pattern(/^[a-z0-9-]+(@[0-9a-z]{1,64})?$/).messages({ 'string.pattern.base': 'must be a base name or name@version' }),
    script: Joi.string().max(1024 * 1024),
    pack: name(),
    force: Joi.boolean().default(false),
    project: projectParam.description('where the temporary box runs and whose base it becomes (default: the token\'s first project; a token without a limit: base-builds, and the base is every project\'s)'),
  }),
  responses: {
    200: { description: 'with `wait`: the build finished in time (succeeded or failed), as GET /v1/base-builds/{id} shows it', schema: buildSchema },
    202: { description: 'accepted (status queued); a cached build answers status succeeded at once', schema: buildStartSchema },
    400: { description: 'both forms or neither (pack, or base + parent + script); an unknown parent' },
    403: { description: 'a shared base name and a project-limited token' },
    404: { description: 'the pack form names a pack that is not installed; a project this token cannot reach (as if it did not exist)' },
    409: { description: 'the base name belongs to another project; the version is being made; force while boxes use the version' },
    429: { description: "a new version and the project's storage quota has no GB free (Retry-After)" },
    507: { description: "a new version and its parent's node has no GB of storage left to promise" },
  },
  handler: async ({ api, identity, body, query }) => {
    const { start, operation } = await startBuild(api, identity, body);
    const headers = { ...operationHeaders(operation), Location: `/v1/base-builds/${start.id}` };
    // `?wait` (DESIGN.md §3): the finished build, else the start as it is now.
    if (query.wait) {
      const done = await api.queue.waitFor(operation.id, query.wait * 1000);
      if (done && (done.status === 'succeeded' || done.status === 'failed')) return { status: 200, body: toApiBuild(await getBuild(api, identity, start.id)), headers };
      const now = await getBuild(api, identity, start.id);
      return { status: 202, body: { ...start, status: now.status }, headers };
    }
    return { status: 202, body: start, headers };
  },
});
