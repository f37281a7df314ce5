import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { run } from '../../core/command';

/** The host's static busybox (Debian's busybox-static). */
export const HOST_BUSYBOX = '/usr/bin/busybox';

/** The base version of the built-in `busybox` base: first 12 hex of sha256 of the binary. */
export async function busyboxVersion(busybox: string = HOST_BUSYBOX): Promise<string> {
  const hash = crypto.createHash('sha256');
  await new Promise<void>((resolve, reject) => {
    fs.createReadStream(busybox)
      .on('data', (chunk) => hash.update(chunk))
      .on('end', () => resolve())
      .on('error', reject);
  });
  return hash.digest('hex').slice(0, 12);
}

const PASSWD = [
  'root:x:0:0:root:/root:/bin/sh',
  'daemon:x:1:1:daemon:/usr/sbin:/bin/false',
  'box:x:1000:1000:box:/home/box:/bin/sh',
  'nobody:x:65534:65534:nobody:/nonexistent:/bin/false',
  '',
].join('\n');

const GROUP = [
  'root:x:0:',
  'daemon:x:1:',
  'tty:x:5:',
  'wheel:x:10:root',
  'box:x:1000:',
  'nogroup:x:65534:',
  '',
].join('\n');

/**
 * Writes a minimal root filesystem made of the host's static busybox into `dir` (which must
 * exist; it is normally a freshly created, empty base dataset). Every applet gets a symlink
 * where busybox would install it (`busybox --list-full`).
 */
export async function fillBusyboxRootfs(dir: string, busybox: string = HOST_BUSYBOX): Promise<void> {
  const dirs: [string, number][] = [
    ['bin', 0o755], ['sbin', 0o755], ['usr', 0o755], ['usr/bin', 0o755], ['usr/sbin', 0o755],
    ['etc', 0o755], ['etc/boxes', 0o755], ['root', 0o700], ['home', 0o755], ['home/box', 0o755],
    ['tmp', 0o1777], ['var', 0o755], ['var/tmp', 0o1777], ['var/log', 0o755], ['proc', 0o555],
    ['sys', 0o555], ['dev', 0o755], ['run', 0o755], ['mnt', 0o755], ['.boxhost', 0o755],
  ];
  for (const [d, mode] of dirs) {
    const p = path.join(dir, d);
    await fs.promises.mkdir(p, { recursive: true });
    await fs.promises.chmod(p, mode);
  }
  await fs.promises.chown(path.join(dir, 'home/box'), 1000, 1000);

  const target = path.join(dir, 'bin/busybox');
  await fs.promises.copyFile(busybox, target);
  await fs.promises.chmod(target, 0o755);

  const { stdout } = await run([busybox, '--list-full']);
  for (const entry of stdout.split('\n').map((l) => l.trim()).filter(Boolean)) {
    // Only applets installed in one of the usual bin directories ("linuxrc" is not one).
    if (!/^(bin|sbin|usr\/bin|usr\/sbin)\/[^/]+$/.test(entry)) continue;
    if (entry === 'bin/busybox') continue;
    const link = path.join(dir, entry);
    const rel = path.relative(path.dirname(link), target);
    try {
      await fs.promises.symlink(rel, link);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
  }

  const files: [string, string, number][] = [
    ['etc/passwd', PASSWD, 0o644],
    ['etc/group', GROUP, 0o644],
    ['etc/shadow', 'root:*:19000:0:99999:7:::\nbox:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n', 0o640],
    ['etc/hostname', 'box\n', 0o644],
    ['etc/hosts', '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n', 0o644],
    ['etc/resolv.conf', '', 0o644],
    ['etc/profile', 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n[ -r /etc/boxes-env ] && set -a && . /etc/boxes-env && set +a\n', 0o644],
  ];
  for (const [f, content, mode] of files) {
    const p = path.join(dir, f);
    await fs.promises.writeFile(p, content);
    await fs.promises.chmod(p, mode);
  }
}
