import type { RequestHandler } from 'express';
import client from 'prom-client';
import type { OperationQueue } from '../jobs/queue';
import type { NodeDirectory } from '../domain/nodes';

/** Prometheus metrics of one api process: request durations, each node's queue depth, and
 *  which nodes are up. */
export function createMetrics(queue: OperationQueue, nodes: NodeDirectory) {
  const registry = new client.Registry();
  client.collectDefaultMetrics({ register: registry });
  const httpDuration = new client.Histogram({
    name: 'boxhost_http_request_duration_seconds',
    help: 'HTTP request duration by route template and status',
    labelNames: ['method', 'route', 'status'],
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [registry],
  });
  new client.Gauge({
    name: 'boxhost_queue_jobs',
    help: 'Jobs in each node queue by state',
    labelNames: ['node', 'state'],
    registers: [registry],
    async collect() {
      try {
        const list = await nodes.list({ committed: false });
        this.reset(); // a forgotten node's series go with it
        for (const n of list) {
          for (const [state, count] of Object.entries(await queue.counts(n.id))) this.set({ node: n.id, state }, count);
        }
      } catch {
        // Redis or the db down: leave the gauge as it was; /healthz reports the outage.
      }
    },
  });
  new client.Gauge({
    name: 'boxhost_node_up',
    help: '1 while a node is up (heartbeat fresh), else 0',
    labelNames: ['node'],
    registers: [registry],
    async collect() {
      try {
        const list = await nodes.list({ committed: false });
        this.reset();
        for (const n of list) this.set({ node: n.id }, n.status === 'up' ? 1 : 0);
      } catch {
        // see above
      }
    },
  });
  new client.Gauge({
    name: 'boxhost_node_storage_restarts',
    help: "Times each node's storage watchdog restarted its storage (docs/decisions.md \"Storage watchdog\")",
    labelNames: ['node'],
    registers: [registry],
    async collect() {
      try {
        const list = await nodes.list({ committed: false });
        this.reset();
        for (const n of list) this.set({ node: n.id }, n.storage_restarts);
      } catch {
        // see above
      }
    },
  });
  const middleware: RequestHandler = (req, res, next) => {
    const end = httpDuration.startTimer();
    res.on('finish', () => {
      // The route template, not the raw path, keeps label cardinality bounded.
      const route = req.route?.path ? `${req.baseUrl}${req.route.path}` : 'unmatched';
      end({ method: req.method, route, status: String(res.statusCode) });
    });
    next();
  };
  return { registry, middleware };
}
