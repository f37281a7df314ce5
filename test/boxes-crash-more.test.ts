/**
 * The second half of test/boxes-crash.test.ts (its header says how it is split): a worker killed
 * in a snapshot, a restore, a base save, import or build, a volume backup or restore; Redis
 * that lost a job; the whole host killed.
 */
process.env.BOXHOST_TEST_CRASH_PART = 'more';
// eslint-disable-next-line @typescript-eslint/no-require-imports
require('./boxes-crash.test');
