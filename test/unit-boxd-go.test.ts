import t from 'tap';
import path from 'node:path';
import { execFile } from 'node:child_process';

/**
 * boxd's own unit tests (boxd/*_test.go, Go's `testing`): what is timing and scheduling inside
 * the agent, such as the drain of a process's output after it exits (boxd/drain.go), is tested
 * there, where a pump that is late or a node that is slow can be made on purpose. Built as
 * scripts/build-boxd.sh builds: Debian's Go, nothing downloaded.
 */
t.test("boxd's Go tests pass", async (t) => {
  const root = path.resolve(__dirname, '../..');
  const res = await new Promise<{ code: number | null; out: string }>((resolve) =>
    execFile(
      'go',
      ['test', '-count=1', '-timeout', '120s', './...'],
      {
        cwd: path.join(root, 'boxd'),
        timeout: 300_000,
        maxBuffer: 16 << 20,
        env: {
          ...process.env,
          CGO_ENABLED: '0',
          GOPROXY: 'off',
          GOFLAGS: '-mod=mod',
          GOTOOLCHAIN: 'local',
          GOCACHE: process.env.GOCACHE ?? path.join(root, '.cache/go-build'),
          GOPATH: process.env.GOPATH ?? path.join(root, '.cache/go'),
        },
      },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? -1) : 0, out: `${stdout}${stderr}` }),
    ),
  );
  t.equal(res.code, 0, `go test: ${res.out.trim().slice(-3000)}`);
  t.match(res.out, /^ok\s+boxhost\/boxd/m, 'the package ran and passed');
});
