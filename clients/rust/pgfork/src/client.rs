//! HTTP client of `pgfork serve`'s native /api/v2, or IntegreSQL's /api/v1.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiErrorKind, Error, Result};

/// Where `pgfork serve` listens when started without --listen.
pub const DEFAULT_URL: &str = "http://127.0.0.1:5000";

/// encodeURIComponent's set: all but `A-Z a-z 0-9 - _ . ! ~ * ' ( )`.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// A query value's set (as URLSearchParams, but spaces as %20).
const QUERY: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'*');

fn enc(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

/// How to connect to one database, as the server sends it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DatabaseConfig {
    /// Host name, IP address, or a Unix socket directory (starting with /).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Role.
    pub username: String,
    /// Password (may be empty).
    pub password: String,
    /// Database name.
    pub database: String,
    /// Other libpq parameters (sslmode, …).
    #[serde(deserialize_with = "string_map")]
    pub additional_params: BTreeMap<String, String>,
    /// The server's Unix socket directory, when it gave one (`pgfork serve`'s
    /// managed server, asked with `?socket=1`): [`DatabaseConfig::local_url`]
    /// connects there when this process can reach it.
    pub socket_dir: String,
}

fn string_map<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let m: Option<BTreeMap<String, Value>> = Option::deserialize(d)?;
    Ok(m.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            (k, v)
        })
        .collect())
}

impl DatabaseConfig {
    fn params(&self) -> BTreeMap<String, String> {
        let mut p = self.additional_params.clone();
        p.entry("sslmode".into()).or_insert_with(|| "disable".into());
        p
    }

    /// A postgres:// URL (sslmode=disable unless additional_params says
    /// otherwise), as the other clients': for tokio-postgres, diesel, psql….
    pub fn url(&self) -> String {
        let mut q = self.params();
        let mut user = enc(&self.username);
        if !self.password.is_empty() {
            user = format!("{user}:{}", enc(&self.password));
        }
        let hostport = if self.host.starts_with('/') {
            q.insert("host".into(), self.host.clone());
            if self.port != 0 {
                q.insert("port".into(), self.port.to_string());
            }
            String::new()
        } else {
            let host = if self.host.contains(':') {
                format!("[{}]", self.host)
            } else {
                self.host.clone()
            };
            if self.port != 0 {
                format!("{host}:{}", self.port)
            } else {
                host
            }
        };
        let auth = if user.is_empty() {
            String::new()
        } else {
            format!("{user}@")
        };
        let query: Vec<String> = q
            .iter()
            .map(|(k, v)| format!("{}={}", utf8_percent_encode(k, QUERY), utf8_percent_encode(v, QUERY)))
            .collect();
        format!(
            "postgres://{auth}{hostport}/{}?{}",
            enc(&self.database),
            query.join("&")
        )
    }

    /// The fastest URL that works from this process: [`DatabaseConfig::url`]
    /// on the server's Unix socket when it gave one ([`DatabaseConfig::socket_dir`])
    /// and this process can reach it (on the same host, as the server's OS user
    /// or root: the directory is private to them), else the TCP URL. The socket
    /// trusts who can reach it, so connecting costs no SCRAM key derivation
    /// (4096 rounds: 0.2-0.3 s of CPU per connection in a debug build).
    /// `PGFORK_NO_SOCKET=1` in the environment: always the TCP URL.
    pub fn local_url(&self) -> String {
        if std::env::var_os("PGFORK_NO_SOCKET").is_some_and(|v| v == "1") {
            return self.url();
        }
        self.socket_url().unwrap_or_else(|| self.url())
    }

    /// [`DatabaseConfig::url`] on the socket, when it can be reached from here.
    #[cfg(unix)]
    fn socket_url(&self) -> Option<String> {
        use std::os::unix::fs::FileTypeExt;
        if !self.socket_dir.starts_with('/') || self.port == 0 {
            return None;
        }
        let sock = std::path::Path::new(&self.socket_dir).join(format!(".s.PGSQL.{}", self.port));
        if !std::fs::metadata(sock).is_ok_and(|m| m.file_type().is_socket()) {
            return None;
        }
        // The user in the query, not as userinfo: sqlx (the url crate) refuses
        // a userinfo with an empty host. No password: the socket trusts.
        let mut q = self.params();
        q.insert("host".into(), self.socket_dir.clone());
        q.insert("port".into(), self.port.to_string());
        q.insert("user".into(), self.username.clone());
        let query: Vec<String> = q
            .iter()
            .map(|(k, v)| format!("{}={}", utf8_percent_encode(k, QUERY), utf8_percent_encode(v, QUERY)))
            .collect();
        Some(format!("postgres:///{}?{}", enc(&self.database), query.join("&")))
    }

    #[cfg(not(unix))]
    fn socket_url(&self) -> Option<String> {
        None
    }

    /// A libpq keyword/value connection string, as the Go client's ConnectionString.
    pub fn conninfo(&self) -> String {
        fn quote(v: &str) -> String {
            if !v.is_empty() && !v.chars().any(|c| c.is_whitespace() || c == '\'' || c == '\\') {
                return v.to_string();
            }
            format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
        }
        let mut parts = vec![
            ("host".to_string(), self.host.clone()),
            ("port".to_string(), self.port.to_string()),
            ("user".to_string(), self.username.clone()),
        ];
        if !self.password.is_empty() {
            parts.push(("password".into(), self.password.clone()));
        }
        parts.push(("dbname".into(), self.database.clone()));
        parts.extend(self.params());
        parts
            .iter()
            .map(|(k, v)| format!("{k}={}", quote(v)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `url` with the password of a postgres:// URL's userinfo replaced by `***`.
pub fn mask_password(url: &str) -> String {
    for scheme in ["postgres://", "postgresql://"] {
        if let Some(rest) = url.strip_prefix(scheme) {
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            if let Some(at) = rest[..end].rfind('@') {
                let userinfo = &rest[..at];
                if let Some(colon) = userinfo.find(':') {
                    return format!("{scheme}{}:***{}", &userinfo[..colon], &rest[at..]);
                }
            }
        }
    }
    url.to_string()
}

/// `url` as errors and `Debug` show a base URL: what can carry a secret
/// replaced by `***` (a userinfo; the path, as `pgfork serve` takes its token
/// as the first path segment, `http://host:5000/TOKEN`; a query, a fragment).
/// Scheme, host and port stay, to say where.
pub fn mask_base_url(url: &str) -> String {
    let Ok(u) = reqwest::Url::parse(url) else {
        return match url.split_once("://") {
            Some((scheme, _))
                if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c)) =>
            {
                format!("{scheme}://***")
            }
            _ => "***".to_string(),
        };
    };
    let auth = if u.username().is_empty() && u.password().is_none() {
        ""
    } else {
        "***@"
    };
    let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
    let path = if u.path().trim_matches('/').is_empty() {
        ""
    } else {
        "/***"
    };
    let query = if u.query().is_some() { "?***" } else { "" };
    let fragment = if u.fragment().is_some() { "#***" } else { "" };
    format!(
        "{}://{auth}{}{port}{path}{query}{fragment}",
        u.scheme(),
        u.host_str().unwrap_or_default()
    )
}

/// The answer to initialize_template: the empty template database to migrate.
#[derive(Debug, Clone)]
pub struct TemplateDatabase {
    /// The template's hash (key).
    pub template_hash: String,
    /// How to connect to it.
    pub config: DatabaseConfig,
}

impl TemplateDatabase {
    /// postgres:// URL of config.
    pub fn url(&self) -> String {
        self.config.url()
    }
}

/// A test database handed out by get_test_database.
#[derive(Debug, Clone)]
pub struct TestDatabase {
    /// The template's hash.
    pub template_hash: String,
    /// The small number in the database's name.
    pub id: i64,
    /// The v2 hand-out token (None on v1): only its holder can give the database back.
    pub token: Option<String>,
    /// How to connect to it.
    pub config: DatabaseConfig,
}

impl TestDatabase {
    /// postgres:// URL of config (with the password).
    pub fn url(&self) -> String {
        self.config.url()
    }
}

/// Options of a [`Client`]. `Debug` never shows the token.
#[derive(Clone)]
pub struct ClientOptions {
    /// Bearer token (the server's: `pgfork serve` reads it from `PGFORK_TOKEN` or `--token-file`).
    pub token: Option<String>,
    /// 1 for IntegreSQL's API, 2 for pgfork's; None: 2, or 1 for a URL ending in /api/v1.
    pub api_version: Option<u8>,
    /// Bound on each request (default 120 s: get_test_database may wait server side).
    pub timeout: Duration,
    /// Retries of a request the server answered 503 or 429 to ("wait"), with backoff (default 3).
    pub retries: u32,
    /// First backoff (default 250 ms), doubled per retry; a Retry-After header wins.
    pub backoff: Duration,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("api_version", &self.api_version)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("backoff", &self.backoff)
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            token: None,
            api_version: None,
            timeout: Duration::from_secs(120),
            retries: 3,
            backoff: Duration::from_millis(250),
        }
    }
}

/// Client of `pgfork serve` (or IntegreSQL). Cheap to clone; safe to share.
///
/// Its connections belong to the tokio runtime that opened them: make a
/// client per runtime (a `#[tokio::test]` has its own runtime).
///
/// `Debug` shows the base URL masked ([`mask_base_url`]) and never the token.
#[derive(Clone)]
pub struct Client {
    base_url: String,
    token: Option<String>,
    http: reqwest::Client,
    api: std::sync::Arc<AtomicU8>,
    version_fixed: bool,
    timeout: Duration,
    retries: u32,
    backoff: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base_url", &self.masked_base_url())
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("api_version", &self.api_version())
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

enum Want {
    Json,
    NoContent,
}

impl Client {
    /// A client for the server at `base_url` (such as `http://127.0.0.1:5000`;
    /// a trailing `/api`, `/api/v2` is ignored, `/api/v1` selects IntegreSQL's API).
    pub fn new(base_url: &str, opts: ClientOptions) -> Result<Client> {
        let raw = if base_url.is_empty() { DEFAULT_URL } else { base_url };
        let bad = || {
            Error::Config(format!(
                "pgfork: base URL {:?} must be http(s)://host[:port][/path]",
                mask_base_url(raw)
            ))
        };
        let u = reqwest::Url::parse(raw).map_err(|_| bad())?;
        if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
            return Err(bad());
        }
        if let Some(v) = opts.api_version
            && v != 1
            && v != 2
        {
            return Err(Error::Config(format!(
                "pgfork: api_version {v}: want 1 (IntegreSQL's API) or 2 (pgfork's)"
            )));
        }
        let mut path = u.path().trim_end_matches('/').to_string();
        let version_fixed = opts.api_version.is_some() || path.ends_with("/api/v1") || path.ends_with("/api/v2");
        let api = opts
            .api_version
            .unwrap_or(if path.ends_with("/api/v1") { 1 } else { 2 });
        for suffix in ["/v1", "/v2", "/api"] {
            if let Some(p) = path.strip_suffix(suffix) {
                path = p.to_string();
            }
        }
        let mut origin = u.clone();
        origin.set_path("");
        origin.set_query(None);
        origin.set_fragment(None);
        let base_url = format!("{}{path}", origin.as_str().trim_end_matches('/'));
        let mut builder = reqwest::Client::builder();
        if u.host_str()
            .is_some_and(|h| h == "localhost" || h == "[::1]" || h.starts_with("127."))
        {
            // A server on this machine is never reached through $HTTP_PROXY.
            builder = builder.no_proxy();
        }
        let http = builder
            .build()
            .map_err(|e| Error::Config(format!("pgfork: cannot make an HTTP client: {e}")))?;
        Ok(Client {
            base_url,
            token: opts.token.filter(|t| !t.is_empty()),
            http,
            api: std::sync::Arc::new(AtomicU8::new(api)),
            version_fixed,
            timeout: opts.timeout,
            retries: opts.retries,
            backoff: opts.backoff,
        })
    }

    /// A client for the server the environment names: `$PGFORK_URL`, else
    /// `$INTEGRESQL_CLIENT_BASE_URL` (then API v1 unless it ends in /api/v2);
    /// the token from `$PGFORK_TOKEN`. When neither variable is set, the
    /// `pgfork serve` of the test run, shared by its processes: the one proven
    /// to hold the state directory, else one started now (see the README).
    /// Nothing is used because it answers at [`DEFAULT_URL`].
    pub fn from_env() -> Result<Client> {
        let s = crate::autostart::env_settings()?;
        let opts = ClientOptions {
            token: s.token,
            api_version: s.api_version,
            ..Default::default()
        };
        Client::new(&s.url, opts)
    }

    /// The server's base URL, without /api….
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// [`Client::base_url`] as errors show it: a token or password in it
    /// replaced by `***` ([`mask_base_url`]).
    pub fn masked_base_url(&self) -> String {
        mask_base_url(&self.base_url)
    }

    /// The API version in use: 2, or 1 (asked for, or fallen back to on a server without v2).
    pub fn api_version(&self) -> u8 {
        self.api.load(Ordering::Relaxed)
    }

    fn api_prefix(&self) -> String {
        format!("/api/v{}", self.api_version())
    }

    async fn request(
        &self,
        op: &'static str,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        want: Want,
        limits: Option<(Duration, u32)>,
    ) -> Result<Option<Value>> {
        let url = format!("{}{path}", self.base_url);
        let (timeout, retries) = limits.unwrap_or((self.timeout, self.retries));
        let mut attempt = 0u32;
        loop {
            let mut rb = self
                .http
                .request(method.clone(), &url)
                .timeout(timeout)
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some(t) = &self.token {
                rb = rb.bearer_auth(t);
            }
            if let Some(b) = body {
                rb = rb.json(b);
            }
            let sent = async {
                let res = rb.send().await?;
                let status = res.status().as_u16();
                let retry_after = res
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .map(Duration::from_secs_f64);
                let text = res.text().await?;
                Ok::<_, reqwest::Error>((status, retry_after, text))
            }
            .await;
            let (status, retry_after, text) = match sent {
                Ok(r) => r,
                // The URL tried, as errors show it: reqwest's own error
                // names it in full, so it goes without it.
                Err(e) if e.is_timeout() => {
                    return Err(Error::Timeout {
                        op,
                        url: format!("{}{path}", self.masked_base_url()),
                        timeout,
                    });
                }
                Err(source) => {
                    return Err(Error::ServerUnreachable {
                        op,
                        url: format!("{}{path}", self.masked_base_url()),
                        source: source.without_url(),
                    });
                }
            };
            let ok = match want {
                Want::Json => status == 200,
                Want::NoContent => status == 204,
            };
            if ok {
                let t = text.trim();
                if t.is_empty() {
                    return Ok(None);
                }
                return serde_json::from_str(t).map(Some).map_err(|e| Error::Api {
                    op,
                    status,
                    kind: ApiErrorKind::Other,
                    message: format!("answer is not JSON ({e}): {}", truncate(t)),
                });
            }
            let mut message = text.trim().to_string();
            if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(&message)
                && let Some(v) = m.get("message").or_else(|| m.get("error"))
            {
                message = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
            }
            let kind = ApiErrorKind::of(op, status, &message);
            let wait = matches!(status, 503 | 429);
            if !wait || attempt >= retries {
                return Err(Error::Api {
                    op,
                    status,
                    kind,
                    message: truncate(&message),
                });
            }
            let delay = retry_after.unwrap_or(self.backoff * 2u32.saturating_pow(attempt));
            attempt += 1;
            tokio::time::sleep(delay).await;
        }
    }

    /// True if GET /healthz answers 200 within `timeout`.
    pub async fn healthy(&self, timeout: Duration) -> bool {
        self.request(
            "healthy",
            reqwest::Method::GET,
            "/healthz",
            None,
            Want::Json,
            Some((timeout, 0)),
        )
        .await
        .is_ok()
    }

    /// Registers a template and returns the empty database to migrate; an
    /// [`ApiErrorKind::TemplateAlreadyInitialized`] error if another caller
    /// did. On a server without /api/v2 (IntegreSQL) switches to v1, unless
    /// the version was set.
    pub async fn initialize_template(&self, hash: &str) -> Result<TemplateDatabase> {
        let body = serde_json::json!({ "hash": hash });
        let op = "initialize_template";
        // socket=1: the managed server's Unix socket directory too (DatabaseConfig::local_url).
        let path = format!("{}/templates?socket=1", self.api_prefix());
        let r = self
            .request(op, reqwest::Method::POST, &path, Some(&body), Want::Json, None)
            .await;
        let v = match r {
            Err(Error::Api {
                status: 404, message, ..
            }) if self.api_version() == 2 => {
                // pgfork serve never answers 404 here: this server has no /api/v2.
                if self.version_fixed {
                    return Err(Error::ApiVersionUnsupported(format!(
                        "{op}: {} has no /api/v2 (404: {message}); it is not pgfork serve (IntegreSQL?): \
                         use API version 1 or a base URL ending in /api/v1",
                        self.masked_base_url()
                    )));
                }
                self.api.store(1, Ordering::Relaxed);
                match self
                    .request(
                        op,
                        reqwest::Method::POST,
                        "/api/v1/templates",
                        Some(&body),
                        Want::Json,
                        None,
                    )
                    .await
                {
                    Err(Error::Api { status: 404, .. }) => {
                        self.api.store(2, Ordering::Relaxed);
                        return Err(Error::ApiVersionUnsupported(format!(
                            "{op}: {} has neither /api/v2 nor /api/v1 (404 on both): is it pgfork serve or \
                             IntegreSQL? A base URL with the token as its first path segment needs it: \
                             http://host:port/TOKEN/api",
                            self.masked_base_url()
                        )));
                    }
                    other => other?,
                }
            }
            other => other?,
        };
        let (template_hash, config) = parse_body(v.as_ref(), hash);
        Ok(TemplateDatabase { template_hash, config })
    }

    /// Marks the template ready: test databases are cloned from it.
    pub async fn finalize_template(&self, hash: &str) -> Result<()> {
        let path = format!("{}/templates/{}", self.api_prefix(), enc(hash));
        self.request(
            "finalize_template",
            reqwest::Method::PUT,
            &path,
            None,
            Want::NoContent,
            None,
        )
        .await?;
        Ok(())
    }

    /// Drops the template; waiters get TemplateDiscarded (TemplateNotFound on v1).
    pub async fn discard_template(&self, hash: &str) -> Result<()> {
        let path = format!("{}/templates/{}", self.api_prefix(), enc(hash));
        self.request(
            "discard_template",
            reqwest::Method::DELETE,
            &path,
            None,
            Want::NoContent,
            None,
        )
        .await?;
        Ok(())
    }

    /// A fresh test database; waits (server side) for finalize and a ready
    /// database. On v2: TemplateDiscarded if the template was discarded,
    /// ServiceUnavailable (with the reason, after retries) if none was ready in time.
    pub async fn get_test_database(&self, hash: &str) -> Result<TestDatabase> {
        // socket=1: the managed server's Unix socket directory too (DatabaseConfig::local_url).
        let path = format!("{}/templates/{}/tests?socket=1", self.api_prefix(), enc(hash));
        let v = self
            .request("get_test_database", reqwest::Method::GET, &path, None, Want::Json, None)
            .await?
            .unwrap_or(Value::Null);
        let (template_hash, config) = parse_body(Some(&v), hash);
        warn_kept(&v);
        let num = |x: Option<&Value>| {
            x.and_then(|n| n.as_i64().or_else(|| n.as_str()?.parse().ok()))
                .unwrap_or(0)
        };
        Ok(match v.get("id") {
            Some(Value::String(token)) => TestDatabase {
                template_hash,
                id: num(v.get("number")),
                token: Some(token.clone()),
                config,
            },
            id => TestDatabase {
                template_hash,
                id: num(id),
                token: None,
                config,
            },
        })
    }

    /// Gives `db` back unchanged (only after a test that did not write).
    pub async fn unlock(&self, db: &TestDatabase) -> Result<()> {
        self.hand_out_op("unlock", db).await
    }

    /// Gives `db` back to be recreated from the template.
    pub async fn recreate(&self, db: &TestDatabase) -> Result<()> {
        self.hand_out_op("recreate", db).await
    }

    /// Keeps `db` as it is for inspection (its test failed): `pgfork serve`
    /// no longer counts it against the pool's maximum, keeps it across a
    /// restart and drops the oldest kept beyond its `--kept-max`; giving it
    /// back later (recreate, unlock) drops it. IntegreSQL has no such call
    /// (an [`Error::Api`](crate::Error::Api)).
    pub async fn keep(&self, db: &TestDatabase) -> Result<()> {
        self.hand_out_op("keep", db).await
    }

    async fn hand_out_op(&self, op: &'static str, db: &TestDatabase) -> Result<()> {
        let h = enc(&db.template_hash);
        let path = match (&db.token, self.api_version()) {
            (Some(token), 2) => format!("/api/v2/templates/{h}/tests/{}/{op}", enc(token)),
            _ => format!("/api/v1/templates/{h}/tests/{}/{op}", db.id),
        };
        self.request(op, reqwest::Method::POST, &path, None, Want::NoContent, None)
            .await?;
        Ok(())
    }

    /// Forgets every template and test database on the server (admin).
    pub async fn reset_all_tracking(&self) -> Result<()> {
        let path = format!("{}/admin/templates", self.api_prefix());
        self.request(
            "reset_all_tracking",
            reqwest::Method::DELETE,
            &path,
            None,
            Want::NoContent,
            None,
        )
        .await?;
        Ok(())
    }

    /// GET /api/v2/templates (pgfork serve only): the server's answer as JSON.
    pub async fn list_templates(&self) -> Result<Value> {
        Ok(self
            .request(
                "list_templates",
                reqwest::Method::GET,
                "/api/v2/templates",
                None,
                Want::Json,
                None,
            )
            .await?
            .unwrap_or(Value::Null))
    }
}

fn truncate(s: &str) -> String {
    if s.len() <= 300 {
        return s.to_string();
    }
    let mut end = 300;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn parse_body(v: Option<&Value>, hash: &str) -> (String, DatabaseConfig) {
    let null = Value::Null;
    let v = v.unwrap_or(&null);
    let db = v.get("database").unwrap_or(&null);
    let h = [v.get("templateHash"), db.get("templateHash")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|s| !s.is_empty())
        .unwrap_or(hash)
        .to_string();
    let config = db
        .get("config")
        .and_then(|c| DatabaseConfig::deserialize(c).ok())
        .unwrap_or_default();
    (h, config)
}

/// Prints, once per process, the server's line (a hand-out's `warning`)
/// saying that databases of failed tests kept for inspection pile up.
fn warn_kept(v: &Value) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if let Some(w) = v.get("warning").and_then(Value::as_str).filter(|w| !w.is_empty()) {
        WARNED.call_once(|| eprintln!("{w}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(host: &str, password: &str) -> DatabaseConfig {
        DatabaseConfig {
            host: host.into(),
            port: 5432,
            username: "u".into(),
            password: password.into(),
            database: "db x".into(),
            additional_params: BTreeMap::new(),
            socket_dir: String::new(),
        }
    }

    #[cfg(unix)]
    #[test]
    fn socket_url_only_when_the_socket_is_there() {
        let dir = std::env::temp_dir().join(format!("pgfork-socket-url-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let mut c = cfg("127.0.0.1", "pw");
        assert_eq!(c.socket_url(), None, "no socket directory given");
        c.socket_dir = dir.to_string_lossy().into_owned();
        assert_eq!(c.socket_url(), None, "nothing listens there");
        std::fs::write(dir.join(".s.PGSQL.5432"), "").unwrap();
        assert_eq!(c.socket_url(), None, "a file is not a socket");
        std::fs::remove_file(dir.join(".s.PGSQL.5432")).unwrap();
        let _l = std::os::unix::net::UnixListener::bind(dir.join(".s.PGSQL.5432")).unwrap();
        let enc_dir = utf8_percent_encode(&c.socket_dir, QUERY).to_string();
        assert_eq!(
            c.socket_url().unwrap(),
            format!("postgres:///db%20x?host={enc_dir}&port=5432&sslmode=disable&user=u")
        );
        c.port = 5433;
        assert_eq!(c.socket_url(), None, "another port's socket");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn url_encodes_and_defaults_sslmode() {
        assert_eq!(
            cfg("127.0.0.1", "p@ss/w").url(),
            "postgres://u:p%40ss%2Fw@127.0.0.1:5432/db%20x?sslmode=disable"
        );
        assert_eq!(cfg("::1", "").url(), "postgres://u@[::1]:5432/db%20x?sslmode=disable");
        assert_eq!(
            cfg("/run/pg", "").url(),
            "postgres://u@/db%20x?host=%2Frun%2Fpg&port=5432&sslmode=disable"
        );
    }

    /// A token in the base URL's path (pgfork serve takes
    /// `http://HOST:PORT/TOKEN/api`) or userinfo, or given as the token,
    /// never shows in an error or a `Debug`; where the server is still does.
    /// No server needed: nothing listens on the port.
    #[tokio::test]
    async fn base_url_secrets_never_show() {
        let secret = "s3cr3tT0KEN9f2c";
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let at = format!("127.0.0.1:{port}");
        let check = |text: &str| {
            assert!(!text.contains(secret), "the secret shows: {text}");
            assert!(text.contains(&at), "the server's address is gone: {text}");
        };
        for url in [
            format!("http://{at}/{secret}/api"),
            format!("http://{at}/{secret}"),
            format!("http://u:{secret}@{at}/api/v2"),
        ] {
            let opts = ClientOptions {
                token: Some(secret.into()),
                retries: 0,
                ..Default::default()
            };
            assert!(!format!("{opts:?}").contains(secret));
            let c = Client::new(&url, opts).unwrap();
            check(&format!("{c:?}"));
            let e = c.initialize_template("x").await.unwrap_err();
            assert!(matches!(e, Error::ServerUnreachable { .. }), "{e:?}");
            check(&format!("{e} / {e:?}"));
        }
        let e = Client::new(&format!("ftp://h/{secret}"), ClientOptions::default()).unwrap_err();
        assert!(!format!("{e} / {e:?}").contains(secret), "{e}");
        let env = crate::env::EnvSettings {
            url: format!("http://{at}/{secret}"),
            from: "PGFORK_URL",
            token: Some(secret.into()),
            api_version: None,
        };
        check(&format!("{env:?}"));
        assert_eq!(mask_base_url(&format!("http://h:5000/{secret}")), "http://h:5000/***");
        assert_eq!(
            mask_base_url(&format!("https://u:{secret}@h/x?token={secret}")),
            "https://***@h/***?***"
        );
        assert_eq!(mask_base_url("http://h:5000"), "http://h:5000");
        assert_eq!(mask_base_url(&format!("nonsense {secret}")), "***");
    }

    #[test]
    fn mask_password_hides_only_the_password() {
        assert_eq!(
            mask_password("postgres://u:secret@h:1/d?x=1"),
            "postgres://u:***@h:1/d?x=1"
        );
        assert_eq!(mask_password("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(mask_password("http://u:p@h/"), "http://u:p@h/");
    }

    #[test]
    fn base_url_suffixes_pick_the_api() {
        let c = Client::new("http://h:1/api/v1/", ClientOptions::default()).unwrap();
        assert_eq!((c.base_url(), c.api_version()), ("http://h:1", 1));
        let c = Client::new("http://h:1/TOKEN/api", ClientOptions::default()).unwrap();
        assert_eq!((c.base_url(), c.api_version()), ("http://h:1/TOKEN", 2));
        assert!(matches!(
            Client::new("ftp://h", ClientOptions::default()),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn conninfo_quotes() {
        assert_eq!(
            cfg("h", "a b'c").conninfo(),
            "host=h port=5432 user=u password='a b\\'c' dbname='db x' sslmode=disable"
        );
    }
}
