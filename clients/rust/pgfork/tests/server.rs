//! The client against a real `pgfork serve` ($PGFORK_URL, $PGFORK_TOKEN, as
//! clients/test.sh exports them), and against small local HTTP listeners for
//! what a live server cannot be made to do on cue (retries, a timeout, no server).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pgfork::{ApiErrorKind, Client, ClientOptions, Error};

fn live() -> Client {
    assert!(
        std::env::var("PGFORK_URL").is_ok_and(|u| !u.is_empty()),
        "these tests need a pgfork serve: start one and export PGFORK_URL (and PGFORK_TOKEN), as clients/test.sh does"
    );
    Client::from_env().unwrap()
}

fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    pgfork::template_hash(None, &format!("rust client test {what} {} {nanos}", std::process::id())).unwrap()
}

fn kind(r: Result<impl std::fmt::Debug, Error>) -> Option<ApiErrorKind> {
    r.expect_err("want an error").api_kind()
}

#[tokio::test]
async fn v2_template_lifecycle() {
    let c = live();
    let h = unique("v2");
    let tpl = c.initialize_template(&h).await.unwrap();
    assert_eq!(tpl.template_hash, h);
    assert!(
        !tpl.config.database.is_empty() && tpl.url().starts_with("postgres://"),
        "{tpl:?}"
    );
    assert_eq!(
        kind(c.initialize_template(&h).await),
        Some(ApiErrorKind::TemplateAlreadyInitialized)
    );
    c.finalize_template(&h).await.unwrap();

    let db = c.get_test_database(&h).await.unwrap();
    assert_eq!(db.template_hash, h);
    assert!(
        db.token.as_deref().is_some_and(|t| t.len() >= 16),
        "v2 hands out a token: {db:?}"
    );
    c.recreate(&db).await.unwrap();
    // A token is good for one give-back.
    assert_eq!(kind(c.recreate(&db).await), Some(ApiErrorKind::TestDatabaseNotFound));

    let db2 = c.get_test_database(&h).await.unwrap();
    c.unlock(&db2).await.unwrap();

    let listed = c.list_templates().await.unwrap();
    assert!(listed.to_string().contains(&h), "{listed}");

    c.discard_template(&h).await.unwrap();
    assert_eq!(
        kind(c.get_test_database(&h).await),
        Some(ApiErrorKind::TemplateDiscarded)
    );
}

/// The managed server clients/test.sh runs names its Unix socket on request,
/// and this process (on its host, as its user or root) connects there: no
/// SCRAM to compute (issue 33). `TestDb::url` is that URL, the TCP one stays.
#[cfg(feature = "sqlx")]
#[tokio::test]
async fn local_client_connects_on_the_socket() {
    use sqlx::Connection;
    let c = live();
    let h = unique("socket");
    c.initialize_template(&h).await.unwrap();
    c.finalize_template(&h).await.unwrap();
    let db = c.get_test_database(&h).await.unwrap();
    assert!(
        db.config.socket_dir.starts_with('/'),
        "no socket directory handed out: {db:?}"
    );
    let on = |url: String| async move {
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let (unix, user): (bool, String) = sqlx::query_as("SELECT inet_server_addr() IS NULL, current_user::text")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        (unix, user)
    };
    let local = db.config.local_url();
    if std::env::var_os("PGFORK_NO_SOCKET").is_some_and(|v| v == "1") {
        assert_eq!(local, db.url());
    } else {
        assert_eq!(on(local).await, (true, db.config.username.clone()));
    }
    assert_eq!(on(db.url()).await, (false, db.config.username.clone()));
    c.recreate(&db).await.unwrap();
    c.discard_template(&h).await.unwrap();
}

#[tokio::test]
async fn v1_api_integer_ids() {
    let env = pgfork::EnvSettings::read();
    let c = Client::new(
        &env.url,
        ClientOptions {
            token: env.token,
            api_version: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(c.api_version(), 1);
    let h = unique("v1");
    c.initialize_template(&h).await.unwrap();
    c.finalize_template(&h).await.unwrap();
    let db = c.get_test_database(&h).await.unwrap();
    assert_eq!(db.token, None, "v1 has integer ids only: {db:?}");
    c.unlock(&db).await.unwrap();
    let db = c.get_test_database(&h).await.unwrap();
    c.recreate(&db).await.unwrap();
    c.discard_template(&h).await.unwrap();
    // IntegreSQL's answer to a discarded template.
    assert_eq!(
        kind(c.get_test_database(&h).await),
        Some(ApiErrorKind::TemplateNotFound)
    );
}

#[tokio::test]
async fn integresql_variable_base_url_talks_v1() {
    let url = std::env::var("INTEGRESQL_CLIENT_BASE_URL")
        .expect("INTEGRESQL_CLIENT_BASE_URL is exported by scripts/ci-setup.sh (clients/test.sh)");
    let s = pgfork::EnvSettings::from_lookup(|k| match k {
        "INTEGRESQL_CLIENT_BASE_URL" => Some(url.clone()),
        "PGFORK_TOKEN" => std::env::var(k).ok(),
        _ => None,
    });
    let c = Client::new(
        &s.url,
        ClientOptions {
            token: s.token,
            api_version: s.api_version,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(c.api_version(), 1);
    let h = unique("integresql-env");
    c.initialize_template(&h).await.unwrap();
    c.discard_template(&h).await.unwrap();
}

#[tokio::test]
async fn wrong_token_is_unauthorized() {
    let env = pgfork::EnvSettings::read();
    assert!(
        env.token.is_some(),
        "this test needs a server with a token: export PGFORK_TOKEN (clients/test.sh does)"
    );
    let c = Client::new(
        &env.url,
        ClientOptions {
            token: Some("not-the-token".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let err = c.initialize_template(&unique("token")).await.unwrap_err();
    assert_eq!(err.api_kind(), Some(ApiErrorKind::Unauthorized), "{err}");
}

#[tokio::test]
async fn unreachable_server_names_the_url_and_pgfork_serve() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // The listener is closed: nothing answers on port.
    let c = Client::new(&format!("http://127.0.0.1:{port}"), ClientOptions::default()).unwrap();
    let err = c.initialize_template("x").await.unwrap_err();
    assert!(matches!(err, Error::ServerUnreachable { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("http://127.0.0.1:{port}/api/v2/templates")),
        "{msg}"
    );
    assert!(msg.contains("pgfork serve") && msg.contains("PGFORK_URL"), "{msg}");
}

/// A listener answering each request with the next of `answers` (status,
/// extra headers, body); returns its URL and the count of requests.
fn answering(answers: Vec<(u16, &'static str, &'static str)>) -> (String, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    std::thread::spawn(move || {
        for (status, headers, body) in answers {
            let Ok((mut s, _)) = l.accept() else { return };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut sink = vec![0; len];
            let _ = r.read_exact(&mut sink);
            count.fetch_add(1, Ordering::SeqCst);
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, n)
}

const DB: &str = r#"{"templateHash":"h","id":"0123456789abcdef0123456789abcdef","number":3,"database":{"templateHash":"h","config":{"host":"127.0.0.1","port":5432,"username":"u","password":"p","database":"d"}}}"#;

#[tokio::test]
async fn retries_503_and_429_honouring_retry_after() {
    let (url, n) = answering(vec![
        (
            503,
            "Retry-After: 0\r\n",
            r#"{"message":"no test database ready in time"}"#,
        ),
        (429, "Retry-After: 0\r\n", r#"{"message":"slow down"}"#),
        (200, "", DB),
    ]);
    let c = Client::new(
        &url,
        ClientOptions {
            backoff: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .unwrap();
    let t = Instant::now();
    let db = c.get_test_database("h").await.unwrap();
    assert_eq!(
        (db.id, db.token.as_deref()),
        (3, Some("0123456789abcdef0123456789abcdef"))
    );
    assert_eq!(n.load(Ordering::SeqCst), 3);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "Retry-After: 0 must win over the 30 s backoff"
    );
}

#[tokio::test]
async fn gives_up_after_the_retries_with_the_servers_reason() {
    let busy = (503, "Retry-After: 0\r\n", r#"{"message":"pool full: 8 of 8 in use"}"#);
    let (url, n) = answering(vec![busy, busy, busy]);
    let c = Client::new(
        &url,
        ClientOptions {
            retries: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let err = c.get_test_database("h").await.unwrap_err();
    assert_eq!(err.api_kind(), Some(ApiErrorKind::ServiceUnavailable), "{err}");
    assert!(err.to_string().contains("pool full: 8 of 8 in use"), "{err}");
    assert_eq!(n.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn no_retry_for_a_template_already_initialized() {
    let (url, n) = answering(vec![
        (423, "", r#"{"message":"template is already initialized"}"#),
        (200, "", "{}"),
    ]);
    let c = Client::new(&url, ClientOptions::default()).unwrap();
    assert_eq!(
        kind(c.initialize_template("h").await),
        Some(ApiErrorKind::TemplateAlreadyInitialized)
    );
    assert_eq!(n.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_silent_server_is_a_timeout() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let c = Client::new(
        &url,
        ClientOptions {
            timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .unwrap();
    let err = c.finalize_template("h").await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    drop(l);
}

#[tokio::test]
async fn ensure_template_against_no_server_is_server_unreachable() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let c = Client::new(&format!("http://127.0.0.1:{port}"), ClientOptions::default()).unwrap();
    let migrate = |_| async { Ok::<(), String>(()) };
    let err = pgfork::ensure_template(&c, "k", migrate).await.unwrap_err();
    assert!(matches!(err, Error::ServerUnreachable { .. }), "{err:?}");
    // A second caller gets the first one's outcome at once, with its message.
    let err = pgfork::ensure_template(&c, "k", migrate).await.unwrap_err();
    assert!(err.to_string().contains("is `pgfork serve` running?"), "{err}");
}
