import { createHash } from "node:crypto";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { PgforkError } from "./errors.js";

function files(root: string): string[] {
  let st;
  try {
    st = statSync(root);
  } catch (e) {
    throw new PgforkError(`template hash: ${root} is not a directory`, { cause: e });
  }
  if (!st.isDirectory()) throw new PgforkError(`template hash: ${root} is not a directory`);
  const found: string[] = [];
  const walk = (dir: string, rel: string): void => {
    for (const ent of readdirSync(dir, { withFileTypes: true })) {
      if (ent.name.startsWith(".")) continue;
      const r = rel ? `${rel}/${ent.name}` : ent.name;
      const p = join(dir, ent.name);
      if (ent.isDirectory()) {
        walk(p, r);
      } else if (ent.isFile()) {
        found.push(r);
      } else if (ent.isSymbolicLink()) {
        // Symlinks to files are hashed with their target's content; symlinks
        // to directories are not entered; dangling ones are left out.
        try {
          if (statSync(p).isFile()) found.push(r);
        } catch {
          // dangling
        }
      }
    }
  };
  walk(root, "");
  // Sort by UTF-8 bytes, as Go's sort.Strings and the Python client do.
  return found.sort((a, b) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")));
}

/**
 * 32 hex digits of a SHA-256 over every file under directory (relative path
 * with forward slashes, and content; names starting with "." left out), in
 * path order, then extraKey: pgfork-template-hash/1, equal to the Go client's
 * TemplateHash and the Python client's template_hash, so all three share
 * templates on one server. directory may be undefined (only extraKey is hashed).
 */
export function templateHash(directory?: string, extraKey = ""): string {
  const h = createHash("sha256");
  h.update("pgfork-template-hash/1\n");
  if (directory) {
    for (const rel of files(directory)) {
      const data = readFileSync(join(directory, rel));
      h.update(`file ${rel}\n${data.length}\n`, "utf8");
      h.update(data);
      h.update("\n");
    }
  }
  const extra = Buffer.from(extraKey, "utf8");
  h.update(`extra ${extra.length}\n`, "utf8");
  h.update(extra);
  return h.digest("hex").slice(0, 32);
}
