// serve.mjs - starting and stopping `ember serve` for the e2e tests
// (sdk_test.mjs, schema_test.mjs): a free loopback port, the server spawned
// with its output inherited, polled on /health until it answers, and a
// graceful stop that reports the exit.

import { spawn } from 'node:child_process';
import { createServer } from 'node:net';

// A port free on 127.0.0.1 now (the OS picks it).
export const freePort = () =>
  new Promise((resolve) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });

// The arguments every test server gets after its own: EMBER_E2E_SERVE_ARGS,
// split at white space (e.g. "--device cuda:0" for the run on a GPU machine:
// scripts/gpu-test.sh).
const extraArgs = () => (process.env.EMBER_E2E_SERVE_ARGS ?? '').split(/\s+/).filter((a) => a !== '');

// Spawns `bin serve ARGS EXTRA --port P` and waits for /health (tries x 100
// ms). Returns { proc, base, exited() } once it answers; a server that exits
// or never answers ends the test process with status 1 and `what` named.
export async function startServer(bin, args, what = 'server', tries = 300) {
  const port = await freePort();
  const proc = spawn(bin, ['serve', ...args, ...extraArgs(), '--port', String(port)], {
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  let exited = null;
  proc.on('exit', (code, signal) => (exited = { code, signal }));
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${base}/health`)).ok) break;
    } catch {}
    if (i > tries || exited) {
      console.error(`${what} did not come up`, exited);
      process.exit(1);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return { proc, base, exited: () => exited };
}

// SIGTERM, then up to `ms` for the exit (SIGKILL after); returns the exit
// ({ code, signal }) or null when it had to be killed.
export async function stopServer(srv, ms = 10000) {
  srv.proc.kill('SIGTERM');
  for (let i = 0; i < ms / 50 && !srv.exited(); i++) await new Promise((r) => setTimeout(r, 50));
  const e = srv.exited();
  if (!e) srv.proc.kill('SIGKILL');
  return e;
}
