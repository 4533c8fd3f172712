import { PgforkError } from "./errors.js";

/**
 * Loads an optional peer dependency (a driver or migration tool) on first
 * use, with an error that says how to install it.
 */
export async function loadPeer<T = Record<string, unknown>>(name: string, why: string): Promise<T> {
  let mod: unknown;
  try {
    mod = await import(name);
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === "ERR_MODULE_NOT_FOUND" || code === "MODULE_NOT_FOUND") {
      throw new PgforkError(`pgfork: ${why} needs the package ${name}: npm install --save-dev ${name}`, { cause: e });
    }
    throw e;
  }
  return mod as T;
}

/** The default export of a CommonJS module loaded by import(), or the module itself. */
export function cjsDefault<T>(mod: unknown): T {
  const m = mod as { default?: unknown };
  return (m.default ?? mod) as T;
}
