import express from 'express';
import Joi from 'joi';
import { Readable } from 'node:stream';
import type { Request, Response } from 'express';
import { defineRoute, validate, wellFormed } from '../../http/route';
import { waitQuery } from '../../http/operation';
import { baseReply } from './reply';
import { importBase, ImportRequest } from '../../../domain/bases';
import { BoxhostError, invalid } from '../../../core/errors';
import { name } from '../../http/schemas';
import { acceptedBaseResponses, provenanceFields } from './schemas';

/** DESIGN.md §3: the JSON form's body is at most 64 MiB. */
const JSON_LIMIT = '64mb';

/** Whose base it is: a project's (only it sees and uses it), or without one and with a token
 *  without a project limit every project's; a project-limited token's defaults to its first. */
const ownerProject = () => name().description("the project whose base it is (default: a project-limited token's first project; a token without a limit: every project's)");

const jsonForm = Joi.object({ name: name().required(), project: ownerProject(), data_base64: Joi.string().base64({ paddingRequired: false }).allow('').required(), ...provenanceFields });

const parseJson = (req: Request, res: Response) =>
  new Promise<unknown>((resolve, reject) => express.json({ limit: JSON_LIMIT, strict: true, reviver: wellFormed })(req, res, (e?: unknown) => (e ? reject(e) : resolve(req.body))));

export default defineRoute<unknown, ImportRequest & { wait?: number }, unknown>({
  method: 'post',
  path: '/v1/bases/import',
  summary: 'Import a base from a tarball: JSON `{name, data_base64, …}`, or the raw tar/gzip body with `?name=`',
  tag: 'bases',
  query: Joi.object({ name: name(), project: ownerProject(), ...provenanceFields, ...waitQuery }),
  body: jsonForm,
  rawBody: true,
  responses: {
    ...acceptedBaseResponses,
    400: { description: 'no name; an archive the import rules refuse (details name the entry): absolute paths, "..", links out of the root, writes through links, unknown entry types; not a tar' },
    404: { description: 'a project the token does not reach' },
    409: { description: 'the name belongs to another owner (a project, every project) or a built-in base' },
    413: { description: 'the body is larger than BOXHOST_BASE_IMPORT_MAX_BYTES (the JSON form: 64 MiB), or it unpacks to more than BOXHOST_BASE_MAX_GB' },
    429: { description: "past the project's storage quota once unpacked (Retry-After); the upload is dropped" },
    507: { description: 'its node has no room for its unpacked size (asked for a GB before the upload, for all of it once in); the upload is dropped' },
  },
  handler: async ({ api, identity, query, req, res }) => {
    try {
      const json = /^application\/json\b/i.test(req.headers['content-type'] ?? '');
      let request: ImportRequest;
      let data: Readable;
      if (json) {
        const body = validate(jsonForm, await parseJson(req, res), 'body') as ImportRequest & { data_base64: string };
        const { data_base64, ...rest } = body;
        request = rest;
        data = Readable.from([Buffer.from(data_base64, 'base64')]);
      } else {
        if (!query.name) throw invalid('the binary form needs ?name=', [{ field: 'name', issue: 'is required' }]);
        const length = Number(req.headers['content-length']);
        if (Number.isFinite(length) && length > api.config.baseImport.maxBytes) {
          throw new BoxhostError('payload_too_large', `the body is ${length} bytes, more than the ${api.config.baseImport.maxBytes} a base import takes (BOXHOST_BASE_IMPORT_MAX_BYTES)`);
        }
        const { wait: _wait, ...rest } = query;
        request = rest;
        data = req;
      }
      return await baseReply(api, await importBase(api, identity, request, data), query.wait, 'import');
    } catch (e) {
      // What is left of a refused upload is not read: the connection closes after the answer.
      if (!req.complete) res.setHeader('connection', 'close');
      throw e;
    }
  },
});
