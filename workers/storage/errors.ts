/** Errors the storage drivers share (the ZFS one and the mock): the API maps them. */

/** What is to go (a base, a snapshot) still has box roots or snapshots depending on it; the
 *  API answers 409. */
export class StorageInUseError extends Error {
  readonly code = 'conflict';
  override readonly name = 'StorageInUseError';
  constructor(message: string, readonly dependents: string[]) {
    super(message);
  }
}
