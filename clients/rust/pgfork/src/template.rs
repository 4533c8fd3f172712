//! Templates built once per key (across threads here, across processes by
//! the server's initialize/finalize protocol) and test databases handed out
//! from them, for any driver: a [`TestDb`] has a URL.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use crate::client::{Client, TemplateDatabase, TestDatabase, mask_password};
use crate::error::{ApiErrorKind, Error, Result};

/// A built template: its key, and the client that talks to its server.
#[derive(Debug, Clone)]
pub struct Template {
    /// The client.
    pub client: Client,
    /// The template's key (hash).
    pub hash: String,
    /// True if this process migrated it, false if another (or an earlier run) had.
    pub built: bool,
}

/// `text` with every occurrence of `password` (plain and URL-encoded) replaced by `***`.
pub(crate) fn redact(text: &str, password: &str) -> String {
    if password.is_empty() {
        return text.to_string();
    }
    let encoded = percent_encoding::utf8_percent_encode(password, percent_encoding::NON_ALPHANUMERIC).to_string();
    text.replace(password, "***").replace(&encoded, "***")
}

/// A build's outcome as every caller of a key shares it: built, or (a
/// migration failed, the error's message).
type Built = Result<bool, (bool, String)>;

/// One cell per template key: the first caller in this process builds, the
/// others wait for it and share its outcome (a failure too).
fn cell(key: &str) -> Arc<tokio::sync::OnceCell<Built>> {
    static CELLS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Built>>>>> = OnceLock::new();
    let mut m = CELLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    m.entry(key.to_string()).or_default().clone()
}

/// Builds template `hash` once: initializes it, runs `migrate` on the empty
/// template database, finalizes it. When another process has initialized it
/// (423) it returns at once (`built` false); [`Template::database`] then
/// waits for that process's finalize. In this process concurrent callers
/// with the same key wait for the first one and share its outcome.
///
/// When `migrate` fails the template is discarded, so every test waiting for
/// it (here or in other processes) fails at once instead of timing out, and
/// [`Error::MigrationFailed`] carries `migrate`'s error (passwords masked).
pub async fn ensure_template<F, Fut, E>(client: &Client, hash: &str, migrate: F) -> Result<Template>
where
    F: FnOnce(TemplateDatabase) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: Display,
{
    let cell = cell(&format!("{}\n{hash}", client.base_url()));
    // The caller that builds gets its error as it is (ServerUnreachable…);
    // the callers that waited for it get its message.
    let mut original = None;
    let built = cell
        .get_or_init(|| async {
            build(client, hash, migrate).await.map_err(|e| {
                let shared = (matches!(e, Error::MigrationFailed(_)), e.to_string());
                original = Some(e);
                shared
            })
        })
        .await;
    if let Some(e) = original {
        return Err(e);
    }
    match built {
        Ok(built) => Ok(Template {
            client: client.clone(),
            hash: hash.to_string(),
            built: *built,
        }),
        Err((true, msg)) => Err(Error::MigrationFailed(msg.clone())),
        Err((false, msg)) => Err(Error::Config(msg.clone())),
    }
}

async fn build<F, Fut, E>(client: &Client, hash: &str, migrate: F) -> Result<bool>
where
    F: FnOnce(TemplateDatabase) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: Display,
{
    let tpl = match client.initialize_template(hash).await {
        Ok(t) => t,
        Err(e) if e.api_kind() == Some(ApiErrorKind::TemplateAlreadyInitialized) => return Ok(false),
        Err(e) => return Err(e),
    };
    if let Err(e) = migrate(tpl.clone()).await {
        let note = match client.discard_template(hash).await {
            Ok(()) => String::new(),
            Err(d) => format!(" (discarding it failed too: {d})"),
        };
        let msg = format!(
            "pgfork: migrating template {hash} ({}) failed; template discarded{note}:\n{e}",
            mask_password(&tpl.url())
        );
        return Err(Error::MigrationFailed(redact(&msg, &tpl.config.password)));
    }
    client.finalize_template(hash).await?;
    Ok(true)
}

impl Template {
    /// A fresh test database; waits for the template's finalize. A discarded
    /// template (its migrations failed in another process) is an
    /// [`Error::MigrationFailed`] naming that.
    pub async fn database(&self) -> Result<TestDb> {
        let td = get_database(&self.client, &self.hash).await?;
        Ok(TestDb {
            client: self.client.clone(),
            db: td,
            done: false,
            name: String::new(),
        })
    }
}

/// get_test_database, with a discarded template as MigrationFailed.
pub(crate) async fn get_database(client: &Client, hash: &str) -> Result<TestDatabase> {
    match client.get_test_database(hash).await {
        Err(e)
            if e.api_kind() == Some(ApiErrorKind::TemplateDiscarded)
                || (e.api_kind() == Some(ApiErrorKind::TemplateNotFound) && client.api_version() == 1) =>
        {
            Err(Error::MigrationFailed(format!(
                "pgfork: template {hash} was discarded: its migrations failed in the process that built it \
                 (see its output): {e}"
            )))
        }
        other => other,
    }
}

/// One test's database. Give it back with [`TestDb::recreate`] (after a test
/// that wrote) or [`TestDb::unlock`]; dropped without that (a failed or
/// panicking test) it is kept on the server for inspection and its URL
/// printed with the password masked (`PGFORK_SHOW_PASSWORD=1` shows it).
#[derive(Debug)]
pub struct TestDb {
    client: Client,
    db: TestDatabase,
    done: bool,
    name: String,
}

impl TestDb {
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn new(client: Client, db: TestDatabase, name: &str) -> TestDb {
        TestDb {
            client,
            db,
            done: false,
            name: name.to_string(),
        }
    }

    /// postgres:// URL for tokio-postgres, diesel, sqlx, psql…: on the server's
    /// Unix socket when this process can reach it (no password needed, no SCRAM
    /// to compute: [`DatabaseConfig::local_url`](crate::DatabaseConfig::local_url)),
    /// else over TCP with the password.
    pub fn url(&self) -> String {
        self.db.config.local_url()
    }

    /// The TCP URL (with the password): works from anywhere that reaches
    /// the server, as another OS user too.
    pub fn tcp_url(&self) -> String {
        self.db.url()
    }

    /// The TCP URL with the password replaced by `***`.
    pub fn safe_url(&self) -> String {
        mask_password(&self.db.url())
    }

    /// The server's answer: config, id, hand-out token.
    pub fn test_database(&self) -> &TestDatabase {
        &self.db
    }

    /// Gives the database back to be recreated from the template.
    pub async fn recreate(mut self) -> Result<()> {
        self.done = true;
        self.client.recreate(&self.db).await
    }

    /// Gives the database back unchanged (only after a test that did not write).
    pub async fn unlock(mut self) -> Result<()> {
        self.done = true;
        self.client.unlock(&self.db).await
    }

    /// Keeps the database on the server for inspection and prints its URL:
    /// `pgfork serve` counts it outside the pool (so kept failures never make
    /// the next tests wait) until it is given back or `--kept-max` newer ones
    /// push it out. A server without the call (IntegreSQL) leaves it in use.
    pub async fn keep(mut self) -> Result<()> {
        self.done = true;
        eprintln!("{}", self.kept_message());
        match self.client.keep(&self.db).await {
            Err(e) if e.api_kind().is_some() => Ok(()),
            r => r,
        }
    }

    /// The line printed for a kept database.
    pub fn kept_message(&self) -> String {
        let show = std::env::var("PGFORK_SHOW_PASSWORD").is_ok_and(|v| v == "1");
        let test = if self.name.is_empty() {
            String::new()
        } else {
            format!(" {}", self.name)
        };
        format!(
            "pgfork: test{test} failed: keeping test database {} (template {}, id {}, hand-out {}) for inspection: {}",
            self.db.config.database,
            self.db.template_hash,
            self.db.id,
            self.db.token.as_deref().unwrap_or("-"),
            if show { self.tcp_url() } else { self.safe_url() }
        )
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if !self.done {
            eprintln!("{}", self.kept_message());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redact_plain_and_encoded() {
        assert_eq!(super::redact("a p@ss b p%40ss", "p@ss"), "a *** b ***");
        assert_eq!(super::redact("x", ""), "x");
    }
}
