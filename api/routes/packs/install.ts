import { defineRoute } from '../../http/route';
import { installPack } from '../../../domain/packs';
import type { PackManifest } from '../../../core/apiTypes';
import { manifestSchema, packSchema } from './schemas';

export default defineRoute<PackManifest>({
  method: 'post',
  path: '/v1/packs',
  summary: 'Install a pack manifest (JSON, or YAML with Content-Type application/yaml); its content hash is the rev, and the same content again changes nothing',
  tag: 'packs',
  body: manifestSchema,
  yaml: true,
  responses: {
    201: { description: 'installed (or already installed with this content)', schema: packSchema },
    400: { description: 'a bad field (details name its path), YAML that does not parse, a default_rev that is not a revision' },
    403: { description: 'a token limited to projects (packs are every project\'s)' },
  },
  handler: async ({ api, identity, body }) => ({ status: 201, body: await installPack(api, identity, body) }),
});
