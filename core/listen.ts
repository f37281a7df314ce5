import type http from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * The write (and read) buffer of every HTTP connection boxhost serves, past which a stream
 * waits for the socket to drain. Node's default (16 KiB) makes a file download wait for a
 * drain every 64 KiB piece, a third of its time in the measurement (docs/decisions.md "Files
 * at stream speed"); 256 KiB takes most of that back while a slow client still holds at most
 * this much in the process.
 */
export const HTTP_BUFFER_BYTES = 256 << 10;

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
