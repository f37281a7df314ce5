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

  call(method: string, p: string, body?: unknown): Promise<CallResult> {
    return callJson(this.url, this.token, method, p, body);
  }
}

/** One API call with the bearer token and a JSON body; its answer parsed as JSON where it is
 *  (the soak's client adds retries and a deadline around it). Transport errors throw. */
export async function callJson(url: string, token: string, method: string, p: string, body?: unknown, signal?: AbortSignal): Promise<CallResult> {
  const headers: Record<string, string> = { authorization: `Bearer ${token}` };
  if (body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(`${url}${p}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal });
  const text = await res.text();
  let parsed: any;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  return { status: res.status, headers: res.headers, body: parsed, text };
}
