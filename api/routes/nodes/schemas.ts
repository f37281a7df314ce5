import Joi from 'joi';
import { timestamp } from '../../http/schemas';

export const NODE_ID_PATTERN = /^[a-z0-9][a-z0-9-]{0,62}$/;
export const nodeParams = Joi.object({ id: Joi.string().pattern(NODE_ID_PATTERN).required() });

const counts = Joi.object({ cpus: Joi.number().integer(), ram_mb: Joi.number().integer(), disk_gb: Joi.number().integer() });

export const nodeSchema = Joi.object({
  id: Joi.string().required(),
  name: Joi.string().required(),
  region: Joi.string().required(),
  state: Joi.string().valid('active', 'draining').required().description('active takes new boxes; draining keeps its boxes and takes none'),
  status: Joi.string().valid('up', 'down').required().description('up while its heartbeat is fresh'),
  reason: Joi.string().allow(null).required().description('why it is down'),
  agent_url: Joi.string().allow(null).required(),
  version: Joi.string().required(),
  storage: Joi.string().required().description('"ok" or why its storage failed its last check ("error: recovering: …" while its storage watchdog brings it back)'),
  storage_restarts: Joi.number().integer().min(0).required().description('times the storage watchdog restarted this node\'s storage'),
  storage_restarted_at: timestamp().allow(null).required(),
  started_at: timestamp().required(),
  heartbeat_at: timestamp().allow(null).required(),
  capacity: counts.required(),
  allocatable: counts
    .keys({ boxes: Joi.number().integer().min(0).allow(null).description('box roots its storage can hold mounted in all (null: no such limit)') })
    .required()
    .description('capacity × the node\'s overcommit ratios: what boxes may be promised in all'),
  committed: counts.keys({ boxes: Joi.number().integer() }).required(),
  created_at: timestamp().required(),
  updated_at: timestamp().required(),
}).label('Node');
