//! The `pgfork` binary for macOS aarch64, as a file of this crate (`bin/pgfork`),
//! for the `pgfork` crate, which depends on this one on macOS aarch64 and starts
//! it when a test run needs a server. Only a released crate carries the
//! binary; a checkout's copy of this crate has none.

use std::path::Path;

/// Where this crate's binary is (it may not exist: see the crate's docs).
pub fn path() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/bin/pgfork"))
}
