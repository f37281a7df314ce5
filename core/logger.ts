import pino from 'pino';

export type Logger = pino.Logger;

export function createLogger(level: string, name = 'boxhost'): Logger {
  return pino({ name, level, base: { pid: process.pid } });
}
