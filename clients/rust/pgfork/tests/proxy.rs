//! A server on this machine is reached directly even when $HTTP_PROXY names
//! a proxy (CI runners often set one). Alone in its binary: it sets the
//! process's environment.

#[tokio::test]
async fn loopback_server_ignores_http_proxy() {
    assert!(
        std::env::var("PGFORK_URL").is_ok_and(|u| u.starts_with("http://127.")),
        "this test needs PGFORK_URL on 127.0.0.1 (clients/test.sh exports it)"
    );
    // Nothing listens on port 1: a request sent through this proxy fails.
    // SAFETY: the only test of this binary; no other thread reads the environment yet.
    unsafe {
        std::env::set_var("HTTP_PROXY", "http://127.0.0.1:1");
        std::env::set_var("http_proxy", "http://127.0.0.1:1");
        std::env::set_var("ALL_PROXY", "http://127.0.0.1:1");
        std::env::remove_var("NO_PROXY");
        std::env::remove_var("no_proxy");
    }
    let c = pgfork::Client::from_env().unwrap();
    assert!(
        c.healthy(std::time::Duration::from_secs(10)).await,
        "GET /healthz went through $HTTP_PROXY"
    );
}
