/**
 * The shapes the HTTP API answers (the spec's tables plus DESIGN.md §6), in one module that the
 * server builds its answers with and the `box` client reads them with. Types only: nothing
 * here runs.
 */
import type { ShownBoxStatus } from './box';
import type { ErrorDetail } from './errors';

export type { ErrorDetail };

export interface ErrorBody {
  error: { code: string; message: string; details: ErrorDetail[] };
}

export interface BoxConfig {
  cpus: number;
  ram_mb: number;
  region: string;
  storage_gb: number;
}

export interface DataMount {
  name: string;
  path: string;
  read_only: boolean;
  ownership?: { kind: string };
}

export interface Publish {
  name: string;
  host: string;
  port: number;
  public: boolean;
  url: string;
  warning?: string;
}

/** The body of a service start (spec "POST …/services"). */
export interface ServiceStartRequest {
  name: string;
  command: string[];
  cwd?: string;
  env?: Record<string, string>;
  port?: number;
  publish?: { name?: string; public?: boolean };
  ready?: { http?: string; port?: number; status?: number; tcp?: number; timeout_secs?: number };
  restart?: 'always' | 'on-failure' | 'never';
  secret_env?: string[];
  stop?: { grace_secs?: number; signal?: string };
  tags?: Record<string, string>;
  user?: string;
}

/** The Service record (spec "Service"); states per DESIGN.md §3. */
export interface Service {
  name: string;
  command: string[];
  commands: { start: string; publish: string; unpublish: string };
  restart: string;
  restarts: number;
  state: 'starting' | 'running' | 'restarting' | 'stopped' | 'exited' | 'failed' | 'corrupt';
  /** Set only on a corrupt spec's tombstone. */
  error?: string;
  last_exit_code?: number;
  pid: number;
  port: number;
  tags: Record<string, string>;
  url?: string;
  user: string;
  warning?: string;
}

export interface Box {
  id: string;
  name: string;
  project: string;
  status: ShownBoxStatus;
  /** Why the box is `failed`, or why its state is `unknown` (its node is not answering). */
  error: string | null;
  created_at: string;
  updated_at: string;
  base: string | null;
  fork: string | null;
  config: BoxConfig | null;
  data_mounts: DataMount[] | null;
  environment: Record<string, string> | null;
  lifecycle: string | null;
  pack: string | null;
  pack_rev: string | null;
  publishes: Publish[] | null;
  rollback_to: string | null;
  tags: Record<string, string> | null;
  termination_grace_period_seconds: number | null;
  url_settings: { auth: string } | null;
  /** The box's IPv4 address on its project bridge. */
  address: string | null;
  /** The node that holds the box. */
  node: string;
}

export interface BoxList {
  boxes: Box[];
  has_more: boolean;
  next_continuation_token: string | null;
}

export type OperationStatus = 'queued' | 'running' | 'succeeded' | 'failed';

/** A box snapshot (DESIGN.md §6: the Data snapshot record). */
export interface BoxSnapshot {
  name: string;
  created_at: string;
  size_bytes: number;
  description?: string;
}

export interface BoxSnapshotList {
  snapshots: BoxSnapshot[];
}

export interface CreateBoxSnapshotRequest {
  name: string;
  description?: string;
}

export interface Operation {
  id: string;
  kind: string;
  status: OperationStatus;
  resource: string;
  progress: number | null;
  error: string | null;
  created_at: string;
  updated_at: string;
}

/** `GET /v1/operations`: newest first, paged like boxes. */
export interface OperationList {
  operations: Operation[];
  has_more: boolean;
  next_continuation_token: string | null;
}

export interface ExecResult {
  detached: boolean;
  exit_code: number;
  process: number;
  stdout: string;
  stderr: string;
  truncated: boolean;
}

/** What a project may hold at most (docs/security.md "Quotas"). */
export interface ProjectQuotas {
  boxes: number;
  cpus: number;
  ram_mb: number;
  storage_gb: number;
  volumes: number;
}

export interface Project {
  name: string;
  created_at: string;
  box_count: number;
  /** Its quotas: its own where set, else the host's defaults. */
  quotas: ProjectQuotas;
  /** What its boxes hold now, against the quotas. */
  usage: ProjectQuotas;
}

export interface Token {
  id: string;
  name: string;
  projects: string[] | null;
  created_at: string;
  expires_at: string | null;
  last_used_at: string | null;
  /** What the token may do beyond its projects' routes (`deploy`); present only when set. */
  scopes?: string[];
  /** Only in the create answer: the secret. */
  token?: string;
}

export interface Grant {
  name: string;
  permissions: Record<string, string>;
  repositories: string[];
  created_at: string;
  updated_at: string;
}

export interface AuthSettings {
  allow_all_idp_accounts: boolean;
  allowed_domains: string[];
  allowed_emails: string[];
  protect_system_domains: boolean;
}

export interface AuthSettingsResponse {
  auth_redirect_uri: string;
  auth_url: string;
  configured: boolean;
  idp_auth_client_url: string;
  settings: AuthSettings;
  cookie_domain?: string;
  cloud_project?: string | null;
  workspace_domain?: string | null;
}

export interface VersionInfo {
  api_version: string;
  version: string;
  commit: string;
}

export interface Health {
  status: 'ok' | 'degraded';
  checks: { db: string; redis: string; storage: string; workers: number; nodes: Record<string, string> };
}

export interface ResourceCounts {
  cpus: number;
  ram_mb: number;
  disk_gb: number;
}

/** A machine that holds boxes (docs/nodes.md). */
export interface Node {
  id: string;
  name: string;
  region: string;
  /** `active` takes new boxes; `draining` keeps its boxes and takes no new ones. */
  state: 'active' | 'draining';
  /** `up` while its heartbeat is fresh (or it runs in the api's own process). */
  status: 'up' | 'down';
  /** Why it is down (null when up). */
  reason: string | null;
  agent_url: string | null;
  version: string;
  /** "ok", or why its storage failed its last check ("error: recovering: …" while the storage
   *  watchdog brings it back). */
  storage: string;
  /** Times the node's storage watchdog restarted its storage, and when it last did. */
  storage_restarts: number;
  storage_restarted_at: string | null;
  started_at: string;
  heartbeat_at: string | null;
  capacity: ResourceCounts;
  /** What boxes may be promised in all: capacity × the node's overcommit ratios. */
  allocatable: ResourceCounts & { boxes: number | null };
  committed: ResourceCounts & { boxes: number };
  created_at: string;
  updated_at: string;
}

/** A path in a box (DESIGN.md §6 "File stat"): `mode` is four octal digits ("0644", "4755"),
 *  `mtime` RFC 3339; `target` only on a symlink. List entries have the same shape. */
export interface FileStat {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: string;
  mtime: string;
  target?: string;
}

export interface FileList {
  entries: FileStat[];
  /** More entries than a listing answers (5000) were in the directory. */
  truncated: boolean;
}

/** `POST /v1/tickets`: a single-use credential for one WebSocket handshake, valid 30 s. */
export interface Ticket {
  ticket: string;
  expires_at: string;
}

/** A base version (the spec's Base, with additions: DESIGN.md §6 allows them). */
export interface Base {
  name: string;
  version: string | null;
  created_at: string;
  size_bytes: number;
  /** `builtin` (made by every node), `saved` (from a box), `imported` (from a tarball). */
  origin: 'builtin' | 'saved' | 'imported' | 'built';
  /** The project a saved base belongs to; null: every project may use it. */
  project: string | null;
  builder: string | null;
  parent: string | null;
  parent_alias: string | null;
  parent_version: string | null;
  script: string | null;
  script_sha256: string | null;
}

export interface BaseList {
  bases: Base[];
}

/** The optional provenance fields a save or an import stores with a base. */
export interface BaseProvenance {
  builder?: string | null;
  parent?: string | null;
  parent_alias?: string | null;
  parent_version?: string | null;
  script?: string | null;
  script_sha256?: string | null;
}

export interface SaveBaseRequest extends BaseProvenance {
  box: string;
  name: string;
}

// ------------------------------------------------------------------ data volumes (docs/data.md)

export interface DataAttachment {
  project: string;
  box: string;
  path: string;
  read_only: boolean;
}

/** DESIGN.md §4's record, plus `project` (its owner, null until it has one) and `node`. */
export interface DataVolume {
  name: string;
  created_at: string;
  updated_at: string;
  size_bytes: number;
  quota_gb: number;
  description: string | null;
  attachments: DataAttachment[];
  project: string | null;
  node: string;
}

export interface CreateDataVolumeRequest {
  name: string;
  size_gb?: number;
  description?: string | null;
  project?: string | null;
}

export interface AttachDataRequest {
  project: string;
  box: string;
  path: string;
  read_only?: boolean;
}

export interface DetachDataRequest {
  project: string;
  box: string;
}

/** The spec's Data snapshot (= the box snapshot record). */
export type DataSnapshot = BoxSnapshot;

export interface CreateDataSnapshotRequest {
  name: string;
  description?: string;
}

/** The spec's Data backup, plus the stream's size and sha256 once written. */
export interface DataBackup {
  name: string;
  status: 'pending' | 'running' | 'completed' | 'failed';
  created_at: string;
  updated_at: string;
  description: string | null;
  error: string | null;
  mode: 'full' | 'incremental' | null;
  parent: string | null;
  size_bytes: number | null;
  sha256: string | null;
}

export interface CreateDataBackupRequest {
  name?: string | null;
  description?: string | null;
}

/** `node` (with `backup` only): restore the backup on that node, which then holds the volume
 *  (docs/data.md "Moving a volume to another node"). */
export type RestoreDataRequest = { snapshot: string } | { backup: string; node?: string };

// ------------------------------------------------------------------ base builds (docs/bases.md "Builds")

export interface StartBaseBuildRequest {
  base?: string;
  parent?: string;
  script?: string;
  pack?: string;
  force?: boolean;
  /** Where the temporary box runs and whose base it becomes (an addition; see docs/bases.md). */
  project?: string;
}

/** The spec's Base build start result, plus `cached`. */
export interface BaseBuildStart {
  id: string;
  status: BaseBuild['status'];
  version: string;
  cached: boolean;
}

export interface BaseBuild {
  id: string;
  status: 'queued' | 'running' | 'succeeded' | 'failed';
  version: string;
  base: string;
  parent: string;
  cached: boolean;
  error: string | null;
  created_at: string;
  updated_at: string;
  project: string;
  box: string | null;
  exit_code: number | null;
}

// ------------------------------------------------------------------ packs (docs/packs.md)

export interface PackVerb {
  command: string[];
  description?: string;
  /** The names of the variables a run may set (others → 400). */
  env?: string[];
}

/** One revision of a pack, as a manifest gives it. */
export interface PackRevisionSpec {
  base: string;
  parent: string;
  script: string;
  services?: ServiceStartRequest[];
  verbs?: Record<string, PackVerb>;
  outputs?: Record<string, string>;
}

/** What `POST /v1/packs` takes (JSON or YAML). */
export interface PackManifest {
  name: string;
  description?: string | null;
  revisions: Record<string, PackRevisionSpec>;
  default_rev: string;
}

/** A revision as a pack shows it: its label's content and the content's hash (`rev`). */
export interface PackRevision extends PackRevisionSpec {
  rev: string;
}

export interface Pack {
  name: string;
  description: string | null;
  /** The installed manifest's content hash: the same content installed again keeps it. */
  rev: string;
  /** The label of the default revision (its hash is `revisions[default_rev].rev`). */
  default_rev: string;
  revisions: Record<string, PackRevision>;
  instances: number;
  created_at: string;
  updated_at: string;
}

export interface RunVerbRequest {
  args?: string[];
  env?: Record<string, string>;
}

export type VerbResult = ExecResult & { event_id: string };

/** The spec's pack verb-execution event. */
export interface PackEvent {
  id: string;
  ts: string;
  pack: string;
  rev: string;
  verb: string;
  args: string[];
  env_set: string[];
  box_name: string;
  project: string;
  who: string;
  outcome: 'success' | 'failure' | 'error';
  duration_ms: number;
  error?: string;
  exit_code?: number;
}

export interface EventList {
  events: PackEvent[];
  has_more: boolean;
  next_continuation_token: string | null;
}

/** A box lifecycle transition, as the event stream sends it (docs/packs.md "Events"). */
export interface BoxEvent {
  id: string;
  ts: string;
  kind: 'box.created' | 'box.stopped' | 'box.resumed' | 'box.deleted' | 'box.restored' | 'box.failed' | 'box.published' | 'box.deployed';
  project: string;
  box_name: string;
  who: string;
  /** `error` for box.failed. */
  outcome: 'success' | 'error';
  /** From the operation's acceptance to the transition (0 where none, a publish). */
  duration_ms: number;
  pack?: string;
  rev?: string;
  error?: string;
}

export const BOX_EVENT_KINDS: BoxEvent['kind'][] = ['box.created', 'box.stopped', 'box.resumed', 'box.deleted', 'box.restored', 'box.failed', 'box.published', 'box.deployed'];

/** A webhook (docs/packs.md "Webhooks"): each event of its project (or of every project) is
 *  POSTed to `url`, signed with its secret; only the create answer carries `secret`. */
export interface Webhook {
  id: string;
  url: string;
  /** null: every project's events (tokens without a project limit only). */
  project: string | null;
  /** The kinds it gets (`verb`, `box.created`, …); null: all. */
  kinds: string[] | null;
  created_at: string;
  last_attempt_at: string | null;
  last_success_at: string | null;
  /** The HTTP status of the latest attempt (null: none yet, or no answer). */
  last_status: number | null;
  last_error: string | null;
  /** Deliveries failed for good in a row; at 20 the webhook is disabled (register it again). */
  failures: number;
  disabled_at: string | null;
  secret?: string;
}

export interface CreateWebhookRequest {
  url: string;
  project?: string | null;
  kinds?: string[];
  secret?: string;
}
