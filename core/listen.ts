import type http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/**
 * The write (and read) buffer of every HTTP connection boxhost serves, past which a stream
 * waits for the socket to drain. Node's default (16 KiB) makes a file download wait for a
 * drain every 64 KiB piece, a third of its time in the measurement (docs/decisions.md "Files
 * at stream speed"); 256 KiB takes most of that back while a slow client still holds at most
 * this much in the process.
 */
export const HTTP_BUFFER_BYTES = 256 << 10;

/** How long a stopping server lets requests under way finish. */
export const CLOSE_GRACE_MS = 2000;

export interface Listening {
  /** `http://host:port` as bound (port 0 resolved). */
  url: string;
  /** Stops accepting, closes idle connections at once, lets requests under way finish for up to
   *  `graceMs` (2 s by default), then drops what is still open. */
  close(graceMs?: number): Promise<void>;
}

/** Starts an HTTP server on `host:port` (0: any free port). */
export async function listen(server: http.Server, port: number, host: string): Promise<Listening> {
  const sockets = new Set<Socket>();
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  const hostPart = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  return {
    url: `http://${hostPart}:${addr.port}`,
    // A request under way when the server stops gets its answer when it can (a create that is
    // recorded is answered 202, not cut off with its box made anyway); a long poll or a stream
    // still open at the end of the grace is cut, as before.
    // Upgraded sockets (WebSocket sessions, proxied tunnels) are no longer the server's
    // connections: closeAllConnections leaves them (nodejs/node#53536), so they are tracked here
    // and destroyed with the rest at the end of the grace, or the close would wait for them.
    close: (graceMs = CLOSE_GRACE_MS) =>
      new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          server.closeAllConnections();
          for (const s of sockets) s.destroy();
        }, graceMs);
        server.close(() => {
          clearTimeout(timer);
          resolve();
        });
        server.closeIdleConnections();
      }),
  };
}
