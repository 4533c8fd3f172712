//! Passes the path of the platform crate's binary (pgfork-bin-<os>-<arch>,
//! a dependency on the platforms that have one) to the crate as
//! `PGFORK_CRATE_BIN`, and the crate's name as `PGFORK_CRATE_BIN_NAME`: cargo
//! gives a build script its dependencies' `links` metadata as
//! `DEP_<LINKS>_<KEY>`. Nothing is set on other platforms.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    for (key, value) in std::env::vars() {
        if let Some(links) = key
            .strip_prefix("DEP_PGFORK_BIN_")
            .and_then(|k| k.strip_suffix("_PATH"))
        {
            let name = format!("pgfork-bin-{}", links.to_lowercase().replacen('_', "-", 1));
            println!("cargo::rustc-env=PGFORK_CRATE_BIN={value}");
            println!("cargo::rustc-env=PGFORK_CRATE_BIN_NAME={name}");
        }
    }
}
