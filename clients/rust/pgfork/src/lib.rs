//! Client of `pgfork serve`: pools of PostgreSQL test databases cloned from
//! a template that is migrated once per key, shared by every test binary and
//! run. See clients/rust/README.md.
#![warn(missing_docs)]

mod autostart;
mod binary;
mod client;
mod env;
mod error;
mod hash;
mod template;

pub use client::{
    Client, ClientOptions, DEFAULT_URL, DatabaseConfig, TemplateDatabase, TestDatabase, mask_base_url, mask_password,
};
pub use env::EnvSettings;
pub use error::{ApiErrorKind, Error, Result};
pub use hash::template_hash;
pub use template::{Template, TestDb, ensure_template};

#[cfg(feature = "sqlx")]
pub mod testing;

/// `#[pgfork::test]`: a drop-in for `#[sqlx::test]` whose template is migrated
/// once per key for every test binary and run (see the crate's README).
#[cfg(feature = "sqlx")]
pub use pgfork_macros::test;
