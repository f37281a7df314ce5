import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { run, sleep } from '../core/command';
import { startTestHost } from './helpers/host';
import { BOX_MAIN, runBox } from './helpers/cli';

/**
 * The CLI's interactive and file commands against a real host: `box cp` both ways (a file and a
 * directory tree), `box cat`, `box files ls/stat/rm`, and `box exec -it` / `box console` driven
 * through tmux (keys sent, the pane read back, the exit code passed through).
 */
const box = runBox;

const sha = (b: Buffer) => crypto.createHash('sha256').update(b).digest('hex');

t.test('box cp, cat, files, exec -it and console', async (t) => {
  const host = await startTestHost(t);
  const env = { BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken, BOXHOST_PROJECT: 'cli', XDG_CONFIG_HOME: fs.mkdtempSync(path.join(os.tmpdir(), 'box-cli-cfg-')) };
  t.teardown(() => fs.rmSync(env.XDG_CONFIG_HOME, { recursive: true, force: true }));
  t.equal((await host.call('POST', '/v1/projects/cli/boxes?wait=120', { body: { name: 'web' } })).body.status, 'running');
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'box-cli-files-'));
  t.teardown(() => fs.rmSync(work, { recursive: true, force: true }));

  t.test('a file both ways, and cat', async (t) => {
    const data = crypto.randomBytes(3 * 1024 * 1024 + 5);
    fs.writeFileSync(path.join(work, 'blob'), data, { mode: 0o640 });
    const up = await box(['cp', path.join(work, 'blob'), 'web:/tmp/blob'], env);
    t.equal(up.code, 0, `box cp ./blob web:/tmp/blob (${up.stderr.trim()})`);
    const cat = await box(['cat', 'web:/tmp/blob'], env);
    t.equal(sha(cat.stdoutBytes), sha(data), 'box cat: the same bytes');
    const stat = await box(['files', 'stat', 'web', '/tmp/blob', '--json'], env);
    t.equal(JSON.parse(stat.stdout.toString()).mode, '0640', 'the local mode went along');
    const down = await box(['cp', 'web:/tmp/blob', work + '/back'], env);
    t.equal(down.code, 0);
    t.equal(sha(fs.readFileSync(path.join(work, 'back'))), sha(data), 'box cp web:/tmp/blob ./back: the same bytes');
    const host1 = await box(['cp', 'web:/etc/hostname', work], env);
    t.equal(host1.code, 0);
    t.equal(fs.readFileSync(path.join(work, 'hostname'), 'utf8'), 'web\n', 'into a directory: under the file\'s own name');
    const bad = await box(['cat', 'web:/nope'], env);
    t.equal(bad.code, 1, 'a missing file: exit 1');
    t.match(bad.stderr, /not.found|no such/i, 'with the server\'s message');
  });

  t.test('a directory tree both ways (tar streams)', async (t) => {
    const src = path.join(work, 'tree');
    fs.mkdirSync(path.join(src, 'a', 'b'), { recursive: true });
    fs.writeFileSync(path.join(src, 'top.txt'), 'top\n');
    fs.writeFileSync(path.join(src, 'a', 'b', 'deep.bin'), crypto.randomBytes(200_000));
    fs.symlinkSync('top.txt', path.join(src, 'link'));
    let t0 = Date.now();
    const up = await box(['cp', src, 'web:/srv/tree'], env);
    t.comment(`cp of a tree up: ${Date.now() - t0} ms`);
    t.equal(up.code, 0, `up (${up.stderr.trim()})`);
    const ls = await box(['files', 'ls', 'web', '/srv/tree', '--json'], env);
    t.same(JSON.parse(ls.stdout.toString()).entries.map((e: any) => e.name), ['a', 'link', 'top.txt'], 'box files ls');
    const back = path.join(work, 'tree-back');
    t0 = Date.now();
    const down = await box(['cp', 'web:/srv/tree', back], env);
    t.comment(`cp of a tree down: ${Date.now() - t0} ms`);
    t.equal(down.code, 0, `down (${down.stderr.trim()})`);
    t.equal(sha(fs.readFileSync(path.join(back, 'a', 'b', 'deep.bin'))), sha(fs.readFileSync(path.join(src, 'a', 'b', 'deep.bin'))), 'a nested file, the same bytes');
    t.equal(fs.readlinkSync(path.join(back, 'link')), 'top.txt', 'a link stays a link');
    // Unpacking that fails here (a 64 KiB filesystem, the tree is 200 KB) ends the copy with the
    // reason: the socket, paused for the unpacking's pace, is read on to the box's status.
    const small = path.join(work, 'small');
    fs.mkdirSync(small);
    await run(['mount', '-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', small]);
    try {
      const full = await box(['cp', 'web:/srv/tree', path.join(small, 't')], env);
      t.equal(full.code, 1, 'a failed unpacking fails the copy');
      t.match(full.stderr.toString(), /unpacking into \S+ failed/);
    } finally {
      await run(['umount', small]);
    }
    const rm = await box(['files', 'rm', 'web', '/srv/tree', '-r'], env);
    t.equal(rm.code, 0);
    t.equal((await box(['files', 'stat', 'web', '/srv/tree'], env)).code, 1, 'box files rm -r: gone');
  });

  t.test('box exec -it and box console through tmux', async (t) => {
    // A tmux server (socket) per session: a new session on the socket of a server still exiting
    // from kill-server failed now and then (CI, 2026-11-24).
    const prefix = `bh-tmux-${crypto.randomBytes(3).toString('hex')}`;
    let sessions = 0;
    let sock = `${prefix}-0`;
    const tmux = (args: string[]) => run(['tmux', '-L', sock, ...args], { allowFailure: true });
    t.teardown(() => tmux(['kill-server']));
    const codeFile = path.join(work, 'code');
    const envs = Object.entries(env).map(([k, v]) => `${k}=${v}`).join(' ');
    const start = async (cmd: string) => {
      fs.rmSync(codeFile, { force: true });
      await tmux(['kill-server']);
      sock = `${prefix}-${++sessions}`;
      const r = await tmux(['new-session', '-d', '-x', '120', '-y', '40', `env ${envs} ${process.execPath} ${BOX_MAIN} ${cmd}; echo "EXIT=$?" > ${codeFile}; sleep 30`]);
      t.equal(r.exitCode, 0, `tmux runs box ${cmd}${r.exitCode ? `: ${r.stderr.trim()}` : ''}`);
    };
    const pane = async () => (await tmux(['capture-pane', '-p', '-J'])).stdout;
    const waitPane = async (re: RegExp) => {
      for (let i = 0; i < 100; i++) {
        if (re.test(await pane())) return true;
        await sleep(100);
      }
      t.comment(await pane());
      return false;
    };
    const waitCode = async (seconds = 10) => {
      for (let i = 0; i < seconds * 10 && !fs.existsSync(codeFile); i++) await sleep(100);
      return fs.existsSync(codeFile) ? fs.readFileSync(codeFile, 'utf8').trim() : 'none';
    };

    await start('exec -it web -- sh');
    t.ok(await waitPane(/[#$] $/m), 'a shell prompt from the box');
    await tmux(['send-keys', 'echo answer-$((6*7)); stty size', 'Enter']);
    t.ok(await waitPane(/answer-42[\s\S]*40 120/), 'keys reach the shell; its terminal has the pane\'s size');
    await tmux(['resize-window', '-x', '100', '-y', '30']);
    await sleep(300);
    await tmux(['send-keys', 'stty size', 'Enter']);
    t.ok(await waitPane(/30 100/), 'a window resize reaches the box (SIGWINCH → resize)');
    await tmux(['send-keys', 'exit 5', 'Enter']);
    t.equal(await waitCode(), 'EXIT=5', 'box exits with the shell\'s code');

    await start('console web');
    t.ok(await waitPane(/[#$] $/m), 'box console: a login shell prompt');
    await tmux(['send-keys', 'echo console-$((1+2))', 'Enter']);
    t.ok(await waitPane(/console-3/));
    await tmux(['send-keys', 'C-d']);
    t.equal(await waitCode(), 'EXIT=0', '^D ends it: exit 0');

    // A long copy shows its progress on a terminal (the pane is its stderr), both ways.
    const big = path.join(work, 'progress.bin');
    fs.writeFileSync(big, '');
    // 600 MB: long enough (over 500 ms) for the final line with its 100% to be drawn.
    fs.truncateSync(big, 600e6);
    await start(`cp ${big} web:/tmp/progress.bin`);
    t.equal(await waitCode(90), 'EXIT=0', 'box cp up on a terminal: exit 0');
    t.match(await pane(), /progress\.bin → web:\/tmp\/progress\.bin: 600\.0 MB of 600\.0 MB 100%, [\d.]+ MB\/s/, 'its progress: bytes of the total, percent, speed');
    await start(`cp web:/tmp/progress.bin ${path.join(work, 'progress-back.bin')}`);
    t.equal(await waitCode(90), 'EXIT=0', 'box cp down on a terminal: exit 0');
    t.match(await pane(), /web:\/tmp\/progress\.bin → .*progress-back\.bin: 600\.0 MB of 600\.0 MB 100%, [\d.]+ MB\/s/, 'and down');
    t.equal(fs.statSync(path.join(work, 'progress-back.bin')).size, 600e6);
    fs.rmSync(path.join(work, 'progress-back.bin'));
    await box(['files', 'rm', 'web', '/tmp/progress.bin'], env);
  });
});
