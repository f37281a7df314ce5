import type http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Listening {
  /** `http://host:port` as bound (port 0 resolved). */
  url: string;
  /** Stops accepting and drops open connections. */
  close(): Promise<void>;
}

/** Starts an HTTP server on `host:port` (0: any free port). */
export async function listen(server: http.Server, port: number, host: string): Promise<Listening> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  const hostPart = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  return {
    url: `http://${hostPart}:${addr.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
