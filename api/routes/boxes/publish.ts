import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { publishBox } from '../../../domain/publishes';
import { publishOptions, publishSchema } from '../services/schemas';
import { boxParams, BoxParams } from './schemas';

export default defineRoute<{ port: number; name?: string; public?: boolean; force?: boolean }, unknown, BoxParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/publish',
  summary: "Publish a port of a box at <name>--<box>--<project>.<publish domain>, through the publish proxy",
  tag: 'publish',
  params: boxParams,
  body: Joi.object({
    port: Joi.number().integer().min(1).max(65535).required().description('the port inside the box'),
    ...publishOptions('p<port>'),
  }),
  responses: {
    201: { description: 'published', schema: publishSchema },
    200: { description: 'replaced a publish (force)', schema: publishSchema },
    404: { description: 'no such box' },
    409: { description: 'the name is taken (without force), or the box is deleting' },
  },
  handler: async ({ api, identity, params, body }) => {
    const { publish, replaced } = await publishBox(api, identity, params.project, params.name, body);
    return { status: replaced ? 200 : 201, body: publish };
  },
});
