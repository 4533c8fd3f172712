#!/usr/bin/env node
// `npx pgfork …`: runs the pgfork binary of the installed platform package
// (@pgfork/<platform>-<arch>), else $PGFORK_BIN, with this process's
// arguments, stdio and exit status; signals are passed on.
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { findPgfork } from "../dist/esm/serve.js";

let bin;
try {
  bin = findPgfork({ dir: fileURLToPath(new URL("..", import.meta.url)), path: false });
} catch (e) {
  process.stderr.write(`${e.message}\n`);
  process.exit(127);
}
const child = spawn(bin, process.argv.slice(2), { stdio: "inherit" });
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(sig, () => child.kill(sig));
child.on("error", (e) => {
  process.stderr.write(`pgfork: cannot run ${bin}: ${e.message}\n`);
  process.exit(127);
});
child.on("exit", (code, signal) => {
  if (signal) {
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
  } else process.exit(code ?? 1);
});
