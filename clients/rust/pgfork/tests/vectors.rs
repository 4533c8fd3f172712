//! template_hash reproduces every case of the shared vectors file
//! (clients/testdata/template-hash-vectors.json) that the Go, Python and JS
//! clients test against, so all clients share templates.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Deserialize)]
struct Doc {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    #[serde(default)]
    extra_key: String,
    #[serde(default)]
    no_dir: bool,
    #[serde(default)]
    files: BTreeMap<String, String>,
    #[serde(default)]
    outside: BTreeMap<String, String>,
    #[serde(default)]
    symlinks: Vec<Symlink>,
    hash: String,
}

#[derive(Deserialize)]
struct Symlink {
    path: String,
    target: String,
}

fn write(p: &Path, data: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

#[test]
fn template_hash_shared_vectors() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/template-hash-vectors.json");
    let raw = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let doc: Doc = serde_json::from_str(&raw).unwrap();
    assert!(!doc.cases.is_empty(), "{} has no cases", file.display());
    let scratch = std::env::temp_dir().join(format!("pgfork-rust-vectors-{}", std::process::id()));
    let mut failed = Vec::new();
    for c in &doc.cases {
        let base: PathBuf = scratch.join(&c.name);
        let tree = base.join("tree");
        std::fs::create_dir_all(&tree).unwrap();
        for (rel, data) in &c.files {
            write(&tree.join(rel), data);
        }
        for (rel, data) in &c.outside {
            write(&base.join(rel), data);
        }
        for s in &c.symlinks {
            std::os::unix::fs::symlink(&s.target, tree.join(&s.path)).unwrap();
        }
        let dir = (!c.no_dir).then_some(tree.as_path());
        let got = pgfork::template_hash(dir, &c.extra_key).unwrap();
        if got != c.hash {
            failed.push(format!(
                "{}: template_hash = {got}, the shared vector says {}",
                c.name, c.hash
            ));
        }
    }
    std::fs::remove_dir_all(&scratch).unwrap();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn template_hash_of_a_missing_directory_is_an_error() {
    let err = pgfork::template_hash(Some(Path::new("/nonexistent/pgfork-migrations")), "").unwrap_err();
    assert!(err.to_string().contains("is not a directory"), "{err}");
}
