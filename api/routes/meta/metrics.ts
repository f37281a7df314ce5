import { defineRoute } from '../../http/route';

export default defineRoute({
  method: 'get',
  path: '/metrics',
  summary: 'Prometheus metrics: request durations, queue depth, process',
  tag: 'meta',
  access: 'public',
  responses: { 200: { description: 'Prometheus text exposition format' } },
  handler: async ({ api, res }) => {
    res.setHeader('Content-Type', api.metrics.contentType);
    res.end(await api.metrics.metrics());
  },
});
