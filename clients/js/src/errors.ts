/** Base of every error this package throws. */
export class PgforkError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** No HTTP answer at all: nothing listens at the URL, or the connection broke. */
export class ServerUnreachable extends PgforkError {}

/** The request took longer than the client's timeout, or its AbortSignal fired. */
export class RequestAborted extends PgforkError {}

/** The server answered with an unexpected status code. */
export class ApiError extends PgforkError {
  readonly op: string;
  readonly status: number;
  readonly serverMessage: string;
  constructor(op: string, status: number, message: string) {
    super(`${op}: ${status} ${message}`.trimEnd());
    this.op = op;
    this.status = status;
    this.serverMessage = message;
  }
}

/** 400: the server refused the hash, id or body. */
export class BadRequest extends ApiError {}
/** 401/403: missing or wrong token. */
export class Unauthorized extends ApiError {}
/** 404: no template with this hash. */
export class TemplateNotFound extends ApiError {}
/** 404 from a test-database call: no test database with this id or token. */
export class TestDatabaseNotFound extends ApiError {}
/** 410 (v2): the template was discarded (its setup failed). v1 answers 404. */
export class TemplateDiscarded extends ApiError {}
/** 423 from initializeTemplate: another caller builds (or built) this template. */
export class TemplateAlreadyInitialized extends ApiError {}
/** 423 from a test-database call. */
export class TestDatabaseInUse extends ApiError {}
/**
 * 503: the server is shutting down or cannot reach PostgreSQL, or (v2) a wait
 * for finalize or a ready database timed out or the pool is full; the message
 * says which. v1 answers 500 for those, as IntegreSQL.
 */
export class ServiceUnavailable extends ApiError {}
/** 507 (v2): insufficient storage, the server's disk is full. */
export class PoolFull extends ApiError {}
/** The server has no /api/v2 (IntegreSQL itself): use apiVersion 1. */
export class ApiVersionUnsupported extends PgforkError {}
/** Migrating or seeding a template failed; the template was discarded. */
export class MigrationFailed extends PgforkError {}

const testOps = new Set(["unlock", "recreate", "unlockTestDatabase", "recreateTestDatabase", "returnTestDatabase"]);

/** The error class for an answer with status to operation op. */
export function errorClass(op: string, status: number, message: string): typeof ApiError {
  switch (status) {
    case 400:
      return BadRequest;
    case 401:
    case 403:
      return Unauthorized;
    case 404:
      // "template not found" names the template; anything else from a test
      // operation (v2: "no test database … under this id") the hand-out.
      return testOps.has(op) && !message.toLowerCase().includes("template not found") ? TestDatabaseNotFound : TemplateNotFound;
    case 410:
      return TemplateDiscarded;
    case 423:
      return testOps.has(op) ? TestDatabaseInUse : TemplateAlreadyInitialized;
    case 503:
      return ServiceUnavailable;
    case 507:
      return PoolFull;
    default:
      return ApiError;
  }
}
