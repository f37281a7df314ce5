import crypto from 'node:crypto';
import express from 'express';
import pinoHttp from 'pino-http';
import type { ApiContext } from './context';
import { mountRoutes, unknownRoute } from './http/route';
import { errorHandler } from './http/errorHandler';
import { websocketRoutes } from './http/upgrade';
import { rateLimitRequests } from './http/rateLimit';
import { routes } from './routes';

/** The express app: request ids and logs, metrics, the rate limit, every route, then the error
 *  contract. The limit comes before any body is read, so a caller over it costs one Redis call. */
export function createApp(api: ApiContext, metricsMiddleware: express.RequestHandler): express.Express {
  const app = express();
  app.disable('x-powered-by');
  app.set('query parser', 'extended');
  app.use(
    pinoHttp({
      logger: api.log,
      genReqId: (req, res) => {
        const id = crypto.randomUUID();
        res.setHeader('X-Request-Id', id);
        return id;
      },
      // Never log secrets: the Authorization header stays out of request logs.
      serializers: { req: (req) => ({ id: req.id, method: req.method, url: req.url }), res: (res) => ({ statusCode: res.statusCode }) },
      customLogLevel: (_req, res, err) => (err || res.statusCode >= 500 ? 'warn' : 'info'),
    }),
  );
  app.use(metricsMiddleware);
  app.use(rateLimitRequests(api, routes));
  app.use(mountRoutes(api, routes));
  app.use(unknownRoute(routes, websocketRoutes));
  app.use(errorHandler);
  return app;
}
