/**
 * Fault injection shared by the mock drivers: a test makes a named method throw on its next
 * call (`failNext`) or on every call (`failAlways`) until `heal`, to drive retries, `onFailed`
 * and reconciliation through their failure paths.
 */
export class WithFaults<M extends string> {
  private readonly faults = new Map<M, { error: Error; always: boolean }>();

  /** Makes `method` throw `error` on its next call only. */
  failNext(method: M, error: Error): void {
    this.faults.set(method, { error, always: false });
  }

  /** Makes `method` throw `error` on every call until `heal`. */
  failAlways(method: M, error: Error): void {
    this.faults.set(method, { error, always: true });
  }

  heal(): void {
    this.faults.clear();
  }

  /** Called first by each mocked method: throws when a fault is set for it. */
  protected fault(method: M): void {
    const f = this.faults.get(method);
    if (!f) return;
    if (!f.always) this.faults.delete(method);
    throw f.error;
  }
}
