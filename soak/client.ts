/**
 * The soak's HTTP client: the bench's kind (fetch, bearer token, JSON), plus what a long run
 * needs: a bound on every call (a hung node must fail the soak, not hang it), 429s waited out as
 * the api asks (Retry-After) and counted, and transport errors answered as a status 0 with their
 * code instead of thrown.
 */
import { nowMs } from '../bench/stats';
import { callJson } from '../bench/api';

export interface CallResult {
  /** 0 when no HTTP answer came (see `transport`). */
  status: number;
  headers: Headers;
  body: any;
  text: string;
  ms: number;
  /** The transport error (`timeout`, `ECONNRESET`, …) when status is 0. */
  transport?: string;
}

export class SoakApi {
  /** 429 answers waited out (rate limit or exec caps). */
  throttled = 0;
  /** 503 answers with Retry-After waited out (a node restarting its storage says so). */
  unavailable = 0;

  constructor(
    readonly url: string,
    private readonly token: string,
    /** Bound on one HTTP call, answer included. */
    private readonly callTimeoutMs: number,
  ) {}

  async call(method: string, p: string, body?: unknown, timeoutMs = this.callTimeoutMs): Promise<CallResult> {
    const t0 = nowMs();
    for (let attempt = 0; ; attempt++) {
      const r = await this.once(method, p, body, timeoutMs);
      // What a careful client does: a 429, or a 503 that says when to come back, is waited out.
      const retryable = r.status === 429 || (r.status === 503 && r.headers.get('retry-after') !== null);
      if (!retryable || attempt >= 50) return { ...r, ms: nowMs() - t0 };
      if (r.status === 429) this.throttled++;
      else this.unavailable++;
      const after = Number(r.headers.get('retry-after'));
      await sleep((Number.isFinite(after) && after > 0 ? after : 1) * 1000);
    }
  }

  private async once(method: string, p: string, body: unknown, timeoutMs: number): Promise<Omit<CallResult, 'ms'>> {
    try {
      return await callJson(this.url, this.token, method, p, body, AbortSignal.timeout(timeoutMs));
    } catch (e) {
      const err = e as Error & { cause?: { code?: string } };
      const transport = err.name === 'TimeoutError' || err.name === 'AbortError' ? 'timeout' : (err.cause?.code ?? err.name ?? 'error');
      return { status: 0, headers: new Headers(), body: undefined, text: `${transport}: ${err.message}`, transport };
    }
  }
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Runs `fn` over `items`, at most `limit` at a time, in order of the list. */
export async function mapLimit<T>(items: T[], limit: number, fn: (t: T, index: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.max(0, Math.min(limit, items.length)) }, async () => {
      while (next < items.length) {
        const i = next++;
        await fn(items[i], i);
      }
    }),
  );
}
