//! Template keys: `pgfork-template-hash/1`, byte for byte the Go client's
//! `TemplateHash`, the Python client's `template_hash` and the JS client's
//! `templateHash` (tested against clients/testdata/template-hash-vectors.json).

use std::fs;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

fn files(root: &Path) -> Result<Vec<String>> {
    let not_dir = |e: Option<std::io::Error>| {
        Error::Config(match e {
            Some(e) => format!("template hash: {} is not a directory: {e}", root.display()),
            None => format!("template hash: {} is not a directory", root.display()),
        })
    };
    // The root may be a symlink to a directory.
    match fs::metadata(root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(not_dir(None)),
        Err(e) => return Err(not_dir(Some(e))),
    }
    let mut found = Vec::new();
    walk(root, "", &mut found)?;
    // Sort by UTF-8 bytes, as Go's sort.Strings and the other clients do.
    found.sort_unstable_by(|a: &String, b: &String| a.as_bytes().cmp(b.as_bytes()));
    Ok(found)
}

fn walk(dir: &Path, rel: &str, found: &mut Vec<String>) -> Result<()> {
    let io = |p: &Path, e: std::io::Error| Error::Config(format!("template hash: {}: {e}", p.display()));
    for ent in fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let ent = ent.map_err(|e| io(dir, e))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let r = if rel.is_empty() { name } else { format!("{rel}/{name}") };
        let p = ent.path();
        let ft = ent.file_type().map_err(|e| io(&p, e))?;
        if ft.is_dir() {
            walk(&p, &r, found)?;
        } else if ft.is_file() {
            found.push(r);
        } else if ft.is_symlink() {
            // Symlinks to files are hashed with their target's content;
            // symlinks to directories are not entered; dangling ones left out.
            if fs::metadata(&p).map(|m| m.is_file()).unwrap_or(false) {
                found.push(r);
            }
        }
    }
    Ok(())
}

/// 32 hex digits of a SHA-256 over every file under `directory` (relative
/// path with forward slashes, and content; names starting with "." left
/// out), in path order, then `extra_key`: the template key every pgfork
/// client computes the same way, so they share templates on one server.
/// With `directory` None only `extra_key` is hashed.
pub fn template_hash(directory: Option<&Path>, extra_key: &str) -> Result<String> {
    let mut h = Sha256::new();
    h.update(b"pgfork-template-hash/1\n");
    if let Some(dir) = directory {
        for rel in files(dir)? {
            let p = dir.join(&rel);
            let data = fs::read(&p).map_err(|e| Error::Config(format!("template hash: {}: {e}", p.display())))?;
            h.update(format!("file {rel}\n{}\n", data.len()).as_bytes());
            h.update(&data);
            h.update(b"\n");
        }
    }
    h.update(format!("extra {}\n", extra_key.len()).as_bytes());
    h.update(extra_key.as_bytes());
    let digest = h.finalize();
    Ok(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
}
