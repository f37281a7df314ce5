/**
 * libuv's thread pool runs every fs call of this process, 4 threads by default. A fs call on a
 * box root whose FUSE daemon (zfs-fuse) hangs holds a thread until the daemon answers; four such
 * calls (creates of a batch, each statting or chmodding its root) left no thread for the rest
 * (then also the database's: its queries ran there before it moved to better-sqlite3), and the
 * node stalled (a CI run's scale test). 64 threads: a hung daemon takes some, the rest go on. Set before the pool
 * starts (its first use), so this module is imported first; a value given by the environment wins.
 */
process.env.UV_THREADPOOL_SIZE ??= '64';
export {};
