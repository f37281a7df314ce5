import { defineRoute } from '../../http/route';
import { getBackup } from '../../../domain/volumeData';
import { backupParams, BackupParams, backupSchema, volumeErrors } from './schemas';

export default defineRoute<unknown, unknown, BackupParams>({
  method: 'get',
  path: '/v1/data/{name}/backups/{backup}',
  summary: 'Get one backup of a data volume',
  tag: 'data',
  params: backupParams,
  responses: { 200: { description: 'the backup', schema: backupSchema }, ...volumeErrors },
  handler: async ({ api, identity, params }) => ({ status: 200, body: await getBackup(api, identity, params.name, params.backup) }),
});
