//! Typed errors of every call: the server's status mapped to a variant, and
//! the client-side failures (unreachable server, timeout, failed migration).

/// Everything this crate returns as an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No HTTP answer at all: nothing listens at the URL, or the connection broke.
    #[error(
        "{op}: no answer from {url} (is `pgfork serve` running? start it with `pgfork serve`, \
         or set PGFORK_URL to where it listens): {source}"
    )]
    ServerUnreachable {
        /// The operation (initialize_template, get_test_database, …).
        op: &'static str,
        /// The URL tried.
        url: String,
        /// The transport's error.
        #[source]
        source: reqwest::Error,
    },
    /// The request took longer than the client's timeout.
    #[error("{op}: no answer from {url} within {timeout:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The URL tried.
        url: String,
        /// The bound that passed.
        timeout: std::time::Duration,
    },
    /// The server answered with a status other than the one expected.
    #[error("{op}: {status} {message}")]
    Api {
        /// The operation.
        op: &'static str,
        /// The HTTP status.
        status: u16,
        /// What that status means for this operation.
        kind: ApiErrorKind,
        /// The server's message (its `{"message"}`, else the body, at most 300 bytes).
        message: String,
    },
    /// The server has no /api/v2 (IntegreSQL itself): use API version 1.
    #[error("{0}")]
    ApiVersionUnsupported(String),
    /// Migrating (or applying fixtures to) a template failed; the template was discarded,
    /// so every test waiting for it fails with this too.
    #[error("{0}")]
    MigrationFailed(String),
    /// No server is configured, none answers at the default URL, and
    /// starting `pgfork serve` for the test run failed (no binary, or it did
    /// not come up: the message has its output).
    #[error("{0}")]
    ServeStart(String),
    /// A bad argument or setting (base URL, migrations directory, …).
    #[error("{0}")]
    Config(String),
    /// Connecting to a test database (or the template) failed.
    #[cfg(feature = "sqlx")]
    #[error("{what}: {source}")]
    Database {
        /// What was being done, with the database's URL (password masked).
        what: String,
        /// sqlx's error.
        #[source]
        source: sqlx::Error,
    },
}

/// What a status means, as the other pgfork clients name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiErrorKind {
    /// 400: the server refused the hash, id or body.
    BadRequest,
    /// 401/403: missing or wrong token (PGFORK_TOKEN).
    Unauthorized,
    /// 404: no template with this hash.
    TemplateNotFound,
    /// 404 from a test-database call: no test database with this id or token.
    TestDatabaseNotFound,
    /// 410 (v2): the template was discarded (its setup failed). v1 answers 404.
    TemplateDiscarded,
    /// 423 from initialize_template: another caller builds (or built) this template.
    TemplateAlreadyInitialized,
    /// 423 from a test-database call.
    TestDatabaseInUse,
    /// 429: too many requests (retried).
    TooManyRequests,
    /// 503: shutting down, PostgreSQL unreachable, or (v2) no database ready in time;
    /// the message says which (retried).
    ServiceUnavailable,
    /// 507 (v2): the server's disk is full.
    PoolFull,
    /// Any other status.
    Other,
}

impl ApiErrorKind {
    /// The kind of an answer with `status` to operation `op` (message: the server's).
    pub fn of(op: &str, status: u16, message: &str) -> Self {
        let test_op = matches!(op, "unlock" | "recreate");
        match status {
            400 => Self::BadRequest,
            401 | 403 => Self::Unauthorized,
            // "template not found" names the template; anything else from a
            // test operation (v2: "no test database … under this id") the hand-out.
            404 if test_op && !message.to_lowercase().contains("template not found") => Self::TestDatabaseNotFound,
            404 => Self::TemplateNotFound,
            410 => Self::TemplateDiscarded,
            423 if test_op => Self::TestDatabaseInUse,
            423 => Self::TemplateAlreadyInitialized,
            429 => Self::TooManyRequests,
            503 => Self::ServiceUnavailable,
            507 => Self::PoolFull,
            _ => Self::Other,
        }
    }
}

impl Error {
    /// The API kind, if the server answered.
    pub fn api_kind(&self) -> Option<ApiErrorKind> {
        match self {
            Error::Api { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
