import fs from 'node:fs';

/** Makes directory `dir` `uid:gid` with `mode`, changing only what differs (one lstat when
 *  nothing does). Not a directory (a symlink put in its place) is an error, never followed. */
export async function ownDir(dir: string, uid: number, gid: number, mode: number): Promise<void> {
  const st = await fs.promises.lstat(dir);
  if (!st.isDirectory()) throw new Error(`${dir} is not a directory`);
  if (st.uid !== uid || st.gid !== gid) await fs.promises.chown(dir, uid, gid);
  if ((st.mode & 0o7777) !== mode) await fs.promises.chmod(dir, mode);
}
