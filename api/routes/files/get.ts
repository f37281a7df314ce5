import Joi from 'joi';
import { pipeReleasing } from '../../../core/bufferLease';
import { defineRoute } from '../../http/route';
import { readFile } from '../../../domain/files';
import { boxParams, BoxParams, fileErrors, pathQuery } from './schemas';

export default defineRoute<unknown, { path: string }, BoxParams>({
  method: 'get',
  path: '/v1/projects/{project}/boxes/{name}/files',
  summary: "A file's bytes, streamed from a running box",
  tag: 'files',
  params: boxParams,
  query: Joi.object({ path: pathQuery }),
  responses: { 200: { description: 'the raw bytes (application/octet-stream), streamed as the box gives them' }, ...fileErrors },
  handler: async ({ api, identity, params, query, res }) => {
    const { stat, data } = await readFile(api, identity, params.project, params.name, query.path);
    res.status(200);
    res.setHeader('content-type', 'application/octet-stream');
    res.setHeader('x-content-type-options', 'nosniff');
    res.setHeader('x-boxhost-file-mode', stat.mode);
    // Back-pressure end to end: a slow client slows the read in the box. A failure mid-way can
    // only cut the body (the status went out with the first byte). Each piece is released once
    // the socket has it, and its read buffer serves the next read (core/bufferLease.ts).
    await pipeReleasing(data, res).catch(() => res.destroy());
  },
});
