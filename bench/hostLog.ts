import { Writable } from 'node:stream';
import pino from 'pino';

/**
 * A logger for a host the bench or the soak starts in its own process: each JSON line the host
 * logs is handed to `onEntry` (parsed, and as written), nothing else is kept or printed.
 */
export function hostLogger(level: pino.Level, onEntry: (entry: any, line: string) => void): pino.Logger {
  const sink = new Writable({
    write(chunk, _enc, cb) {
      for (const line of chunk.toString().split('\n')) {
        if (!line) continue;
        let entry: any;
        try {
          entry = JSON.parse(line);
        } catch {
          continue; // not JSON
        }
        onEntry(entry, line);
      }
      cb();
    },
  });
  return pino({ level }, sink);
}
