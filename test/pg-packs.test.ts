/**
 * test/packs.test.ts again on PostgreSQL (a fresh schema for its host): packs, revisions and the
 * events' newest-first pages on the other database the API supports.
 */
process.env.BOXHOST_TEST_DB = 'postgres';
// eslint-disable-next-line @typescript-eslint/no-require-imports
require('./packs.test');
