import parse from 'joi-to-json';
import type Joi from 'joi';
import type { RouteDef } from './route';
import { COMMON_ERRORS, errorBody } from './schemas';

/** joi-to-json writes a map whose keys are a regular expression both as patternProperties (right)
 *  and as a property named `/<source>/` (a key nobody sends): the latter is dropped. */
function dropRegexProperties(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(dropRegexProperties);
  if (node === null || typeof node !== 'object') return node;
  const o = node as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) out[k] = dropRegexProperties(v);
  if (o.patternProperties && out.properties && typeof out.properties === 'object') {
    const patterns = Object.keys(o.patternProperties as object);
    out.properties = Object.fromEntries(Object.entries(out.properties as object).filter(([k]) => !patterns.some((p) => k === `/${p}/`)));
  }
  return out;
}

const toSchema = (s: Joi.Schema) => dropRegexProperties(parse(s, 'open-api-3.1')) as Record<string, unknown>;

function parameters(def: RouteDef) {
  const out: unknown[] = [];
  for (const [where, schema] of [['path', def.params], ['query', def.query]] as const) {
    if (!schema) continue;
    const json = toSchema(schema) as { properties?: Record<string, unknown>; required?: string[] };
    for (const [name, s] of Object.entries(json.properties ?? {})) {
      out.push({ name, in: where, required: where === 'path' || (json.required ?? []).includes(name), schema: s });
    }
  }
  return out;
}

/** A body is required when its schema asks for something of it: a required key, or a rule over
 *  keys (`xor`, `or`); one that takes nothing or only optional fields may be left out (the api
 *  reads a missing body as `{}`). */
function bodyRequired(schema: Joi.Schema): boolean {
  const d = schema.describe() as { type?: string; keys?: Record<string, { flags?: { presence?: string } }>; dependencies?: unknown[] };
  if (d.type !== 'object') return true;
  return Object.values(d.keys ?? {}).some((k) => k.flags?.presence === 'required') || (d.dependencies?.length ?? 0) > 0;
}

/** The OpenAPI 3.1 document, made from the same route definitions the server mounts. */
export function buildOpenApi(routes: RouteDef[], version: string) {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const def of routes) {
    const responses: Record<string, unknown> = {};
    for (const [status, doc] of Object.entries(def.responses)) {
      responses[status] = doc.schema
        ? { description: doc.description, content: { 'application/json': { schema: toSchema(doc.schema) } } }
        : { description: doc.description };
    }
    for (const [status, code] of Object.entries(COMMON_ERRORS)) {
      // Public routes need no token and are never rate limited.
      if (def.access === 'public' && (status === '401' || status === '429')) continue;
      responses[status] ??= { description: code, content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } };
    }
    if (def.body) responses[415] ??= { description: 'invalid_argument: a charset other than UTF-8 or an unknown Content-Encoding', content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } };
    paths[def.path] ??= {};
    paths[def.path][def.method] = {
      summary: def.summary,
      tags: [def.tag],
      operationId: `${def.method}${def.path.replace(/[{}]/g, '').replace(/[^A-Za-z0-9]+(.)?/g, (_m, c: string | undefined) => (c ? c.toUpperCase() : ''))}`,
      security: def.access === 'public' ? [] : [{ bearer: [] }],
      parameters: parameters(def),
      ...(def.body ? { requestBody: { required: bodyRequired(def.body), content: { 'application/json': { schema: toSchema(def.body) } } } } : {}),
      ...(def.rawBody ? { requestBody: { required: true, content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } } } : {}),
      responses,
    };
  }
  return {
    openapi: '3.1.0',
    info: { title: 'boxhost API', version },
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
      schemas: { Error: toSchema(errorBody) },
    },
    paths,
  };
}
