import type { RequestHandler } from 'express';
import client from 'prom-client';
import type { OperationQueue } from '../jobs/queue';

/** Prometheus metrics of one api process: request durations and the queue's depth. */
export function createMetrics(queue: OperationQueue) {
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
    help: 'Jobs in the operation queue by state',
    labelNames: ['state'],
    registers: [registry],
    async collect() {
      try {
        for (const [state, n] of Object.entries(await queue.counts())) this.set({ state }, n);
      } catch {
        // Redis down: leave the gauge as it was; /healthz reports the outage.
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
