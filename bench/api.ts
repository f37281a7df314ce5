/** The bench's HTTP client: one call, its status, headers and parsed body (no retries: a
 *  bench measures what a call costs). */
export interface CallResult {
  status: number;
  headers: Headers;
  body: any;
  text: string;
}

export class Api {
  constructor(
    readonly url: string,
    readonly token: string,
  ) {}

  async call(method: string, p: string, body?: unknown): Promise<CallResult> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.token}` };
    if (body !== undefined) headers['content-type'] = 'application/json';
    const res = await fetch(`${this.url}${p}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await res.text();
    let parsed: any;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      parsed = undefined;
    }
    return { status: res.status, headers: res.headers, body: parsed, text };
  }
}
