/**
 * test/base-builds.test.ts again with every test host on PostgreSQL (a fresh schema per host,
 * test/helpers/db.ts) instead of its sqlite file: the API runs on both databases it supports.
 */
process.env.BOXHOST_TEST_DB = 'postgres';
// eslint-disable-next-line @typescript-eslint/no-require-imports
require('./base-builds.test');
