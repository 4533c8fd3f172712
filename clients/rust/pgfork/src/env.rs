//! The server settings from the environment, as every pgfork client reads them.

use crate::client::DEFAULT_URL;

/// Settings read from the environment. `Debug` shows the URL masked
/// ([`crate::mask_base_url`]) and never the token.
#[derive(Clone, PartialEq, Eq)]
pub struct EnvSettings {
    /// `$PGFORK_URL`, else `$INTEGRESQL_CLIENT_BASE_URL`, else [`DEFAULT_URL`].
    pub url: String,
    /// Which of those gave `url`.
    pub from: &'static str,
    /// `$PGFORK_TOKEN`.
    pub token: Option<String>,
    /// `Some(1)` when the URL came from `$INTEGRESQL_CLIENT_BASE_URL` (the
    /// server may be IntegreSQL) and does not end in /api/v2.
    pub api_version: Option<u8>,
}

impl std::fmt::Debug for EnvSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvSettings")
            .field("url", &crate::client::mask_base_url(&self.url))
            .field("from", &self.from)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("api_version", &self.api_version)
            .finish()
    }
}

impl EnvSettings {
    /// The settings of this process's environment.
    pub fn read() -> EnvSettings {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The settings from `get` (a variable's value, None when unset).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> EnvSettings {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        let token = get("PGFORK_TOKEN");
        if let Some(url) = get("PGFORK_URL") {
            return EnvSettings {
                url,
                from: "PGFORK_URL",
                token,
                api_version: None,
            };
        }
        if let Some(url) = get("INTEGRESQL_CLIENT_BASE_URL") {
            // IntegreSQL's clients' variable: the server may be IntegreSQL itself.
            let v1 = !url.trim_end_matches('/').ends_with("/api/v2");
            return EnvSettings {
                url,
                from: "INTEGRESQL_CLIENT_BASE_URL",
                token,
                api_version: v1.then_some(1),
            };
        }
        EnvSettings {
            url: DEFAULT_URL.into(),
            from: "default",
            token,
            api_version: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgfork_url_wins_then_integresql_then_default() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            EnvSettings::from_lookup(move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
        };
        let s = env(&[
            ("PGFORK_URL", "http://a:1"),
            ("INTEGRESQL_CLIENT_BASE_URL", "http://b:2/api"),
            ("PGFORK_TOKEN", "t"),
        ]);
        assert_eq!(
            (s.url.as_str(), s.from, s.token.as_deref(), s.api_version),
            ("http://a:1", "PGFORK_URL", Some("t"), None)
        );
        let s = env(&[("INTEGRESQL_CLIENT_BASE_URL", "http://b:2/api")]);
        assert_eq!((s.from, s.api_version), ("INTEGRESQL_CLIENT_BASE_URL", Some(1)));
        let s = env(&[("INTEGRESQL_CLIENT_BASE_URL", "http://b:2/api/v2/")]);
        assert_eq!(s.api_version, None);
        let s = env(&[("PGFORK_URL", "")]);
        assert_eq!((s.url.as_str(), s.from), (DEFAULT_URL, "default"));
    }
}
