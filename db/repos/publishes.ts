import type { Db } from '../knex';

export interface PublishRow {
  host: string;
  box_id: string;
  project: string;
  name: string;
  port: number;
  /** sqlite answers 0/1. */
  public: boolean | number;
  /** The service it publishes, or null for a box publish. */
  service: string | null;
  warning: string | null;
  created_at: string;
  updated_at: string;
}

export const publishesRepo = {
  byHost: (db: Db, host: string) => db<PublishRow>('publishes').where({ host }).first(),
  ofBox: (db: Db, boxId: string) => db<PublishRow>('publishes').where({ box_id: boxId }).orderBy('name'),
  ofBoxes: (db: Db, boxIds: string[]) => db<PublishRow>('publishes').whereIn('box_id', boxIds).orderBy('name'),
  byName: (db: Db, boxId: string, name: string) => db<PublishRow>('publishes').where({ box_id: boxId, name }).first(),
  ofService: (db: Db, boxId: string, service: string) => db<PublishRow>('publishes').where({ box_id: boxId, service }).first(),
  insert: (db: Db, row: PublishRow) => db<PublishRow>('publishes').insert(row),
  removeHost: (db: Db, host: string) => db<PublishRow>('publishes').where({ host }).delete(),
};
