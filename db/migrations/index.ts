import type { Knex } from 'knex';
import * as m001 from './001_backbone';
import * as m002 from './002_boxes';
import * as m003 from './003_nodes';
import * as m004 from './004_admission';
import * as m005 from './005_storage_watchdog';
import * as m006 from './006_root_limit';
import * as m007 from './007_publishes';
import * as m008 from './008_bases';
import * as m009 from './009_data';
import * as m010 from './010_base_builds';
import * as m011 from './011_volume_moves';
import * as m012 from './012_packs';
import * as m013 from './013_deploys';
import * as m014 from './014_webhooks';
import * as m015 from './015_outputs';
import * as m016 from './016_attachment_mounted';
import * as m017 from './017_operation_status';

type Migration = { up(db: Knex): Promise<void>; down(db: Knex): Promise<void> };

const all: Record<string, Migration> = {
  '001_backbone': m001,
  '002_boxes': m002,
  '003_nodes': m003,
  '004_admission': m004,
  '005_storage_watchdog': m005,
  '006_root_limit': m006,
  '007_publishes': m007,
  '008_bases': m008,
  '009_data': m009,
  '010_base_builds': m010,
  '011_volume_moves': m011,
  '012_packs': m012,
  '013_deploys': m013,
  '014_webhooks': m014,
  '015_outputs': m015,
  '016_attachment_mounted': m016,
  '017_operation_status': m017,
};

/** Migrations are compiled into the build, listed here in order (no directory scan). */
export const migrations: Knex.MigrationSource<string> = {
  getMigrations: async () => Object.keys(all),
  getMigrationName: (name) => name,
  getMigration: async (name) => all[name],
};
