import type { RouteDef } from '../http/route';
import { buildOpenApi } from '../http/openapi';
import { versionInfo } from '../../core/version';
import version from './meta/version';
import healthz from './meta/healthz';
import openapi, { openapiDocument } from './meta/openapi';
import metrics from './meta/metrics';
import createToken from './tokens/create';
import listTokens from './tokens/list';
import deleteToken from './tokens/delete';
import getAuthSettings from './auth/getSettings';
import putAuthSettings from './auth/putSettings';
import createGrant from './grants/create';
import listGrants from './grants/list';
import getGrant from './grants/get';
import updateGrant from './grants/update';
import deleteGrant from './grants/delete';
import listOperations from './operations/list';
import getOperation from './operations/get';
import waitOperation from './operations/wait';
import listProjects from './projects/list';
import getProject from './projects/get';
import updateProject from './projects/update';
import createBox from './boxes/create';
import listBoxes from './boxes/list';
import getBox from './boxes/get';
import updateBox from './boxes/update';
import deleteBox from './boxes/delete';
import stopBox from './boxes/stop';
import resumeBox from './boxes/resume';
import execBox from './boxes/exec';
import runVerb from './boxes/verb';
import deployBox from './boxes/deploy';
import rollbackBox from './boxes/rollback';
import createWebhook from './webhooks/create';
import listWebhooks from './webhooks/list';
import deleteWebhook from './webhooks/delete';
import installPack from './packs/install';
import listPacks from './packs/list';
import getPack from './packs/get';
import deletePack from './packs/delete';
import listEvents from './events/list';
import streamEvents from './events/stream';
import publishBox from './boxes/publish';
import unpublishBox from './boxes/unpublish';
import startService from './services/start';
import listServices from './services/list';
import getService from './services/get';
import stopService from './services/stop';
import resumeService from './services/resume';
import restartService from './services/restart';
import deleteService from './services/delete';
import serviceLogs from './services/logs';
import publishService from './services/publish';
import unpublishService from './services/unpublish';
import createSnapshot from './snapshots/create';
import listSnapshots from './snapshots/list';
import getSnapshot from './snapshots/get';
import restoreSnapshot from './snapshots/restore';
import deleteSnapshot from './snapshots/delete';
import createTicket from './tickets/create';
import getFile from './files/get';
import putFile from './files/put';
import statFile from './files/stat';
import listFiles from './files/list';
import deleteFile from './files/delete';
import createVolume from './data/create';
import listVolumes from './data/list';
import getVolume from './data/get';
import deleteVolume from './data/delete';
import attachVolume from './data/attach';
import detachVolume from './data/detach';
import createDataSnapshot from './data/snapshotCreate';
import listDataSnapshots from './data/snapshotList';
import deleteDataSnapshot from './data/snapshotDelete';
import createBackup from './data/backupCreate';
import listBackups from './data/backupList';
import getBackup from './data/backupGet';
import restoreVolume from './data/restore';
import startBaseBuild from './baseBuilds/start';
import getBaseBuild from './baseBuilds/get';
import baseBuildLogs from './baseBuilds/logs';
import listBases from './bases/list';
import getBase from './bases/get';
import deleteBase from './bases/delete';
import exportBase from './bases/export';
import saveBase from './bases/save';
import importBase from './bases/import';
import buildRecipeBase from './bases/build';
import listNodes from './nodes/list';
import getNode from './nodes/get';
import updateNode from './nodes/update';
import deleteNode from './nodes/delete';

/** Every route of the api. The OpenAPI document is made from this list, so a route that is
 *  mounted is documented. */
export const routes: RouteDef[] = [
  version, healthz, openapi, metrics,
  createToken, listTokens, deleteToken,
  getAuthSettings, putAuthSettings,
  createGrant, listGrants, getGrant, updateGrant, deleteGrant,
  listOperations, getOperation, waitOperation,
  listProjects, getProject, updateProject,
  createBox, listBoxes, getBox, updateBox, deleteBox, stopBox, resumeBox, execBox,
  publishBox, unpublishBox,
  startService, listServices, getService, stopService, resumeService, restartService, deleteService, serviceLogs, publishService, unpublishService,
  createSnapshot, listSnapshots, getSnapshot, restoreSnapshot, deleteSnapshot,
  statFile, listFiles, getFile, putFile, deleteFile,
  createTicket,
  listBases, importBase, getBase, deleteBase, exportBase, saveBase, buildRecipeBase, startBaseBuild, getBaseBuild, baseBuildLogs,
  createVolume, listVolumes, getVolume, deleteVolume, attachVolume, detachVolume, createDataSnapshot, listDataSnapshots, deleteDataSnapshot,
  createBackup, listBackups, getBackup, restoreVolume,
  installPack, listPacks, getPack, deletePack, runVerb, deployBox, rollbackBox, listEvents, streamEvents, createWebhook, listWebhooks, deleteWebhook,
  listNodes, getNode, updateNode, deleteNode,
];

openapiDocument.current = buildOpenApi(routes, versionInfo().version);
