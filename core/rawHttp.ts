import http from 'node:http';
import type { Duplex } from 'node:stream';
import type { BoxhostError } from './errors';

/**
 * Answers a request whose socket was taken from the HTTP server (an upgrade refused before its
 * 101: the api's WebSocket routes, the publish proxy, the node agent's tunnels and sessions):
 * the status and the contract's error body, then the connection closes.
 */
export function endWithError(socket: Duplex, status: number, error: BoxhostError, headers: Record<string, string> = {}): void {
  const body = JSON.stringify(error.toBody());
  const head = [
    `HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ''}`,
    'Content-Type: application/json; charset=utf-8',
    `Content-Length: ${Buffer.byteLength(body)}`,
    'Connection: close',
    ...Object.entries({ ...error.headers, ...headers }).map(([k, v]) => `${k}: ${v}`),
  ];
  if (socket.writable) socket.end(`${head.join('\r\n')}\r\n\r\n${body}`);
  else socket.destroy();
}
