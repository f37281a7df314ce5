import Joi from 'joi';
import { defineRoute } from '../../http/route';

/** Filled in by api/routes/index.ts, which knows every route (this one included). */
export const openapiDocument: { current?: unknown } = {};

export default defineRoute({
  method: 'get',
  path: '/openapi.json',
  summary: 'This API as an OpenAPI 3.1 document',
  tag: 'meta',
  access: 'public',
  responses: { 200: { description: 'the document', schema: Joi.object() } },
  handler: async () => ({ body: openapiDocument.current }),
});
