//! Tells the pgfork crate where this crate's binary is: the `path` metadata
//! of `links`, which cargo passes to pgfork's build script as
//! `DEP_PGFORK_BIN_<PLATFORM>_PATH`.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo::metadata=path={dir}/bin/pgfork");
    println!("cargo::rerun-if-changed=build.rs");
}
