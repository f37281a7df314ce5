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
  getOperation, waitOperation,
  listProjects, getProject, updateProject,
  createBox, listBoxes, getBox, updateBox, deleteBox, stopBox, resumeBox, execBox,
  listNodes, getNode, updateNode, deleteNode,
];

openapiDocument.current = buildOpenApi(routes, versionInfo().version);
