/** The name rule of DESIGN.md §3 (projects, boxes, services, snapshots, publishes, …): lowercase
 *  a-z 0-9 and `-`, 1–63 characters, starting and ending alphanumeric, no `--`. Every layer that
 *  checks a name (the api's schemas, job payloads, the node protocol) checks this one. */
export const NAME_PATTERN = /^(?!.*--)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
