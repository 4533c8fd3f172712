//! The README's examples are these tests: each ```rust block of
//! clients/rust/README.md preceded by `<!-- file: PATH -->` must be the file
//! PATH verbatim (so CI compiles and runs exactly what the README shows).

use std::path::Path;

#[test]
fn readme_blocks_are_the_example_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut checked = 0;
    let mut rest = readme.as_str();
    while let Some(i) = rest.find("<!-- file: ") {
        rest = &rest[i + "<!-- file: ".len()..];
        let end = rest.find(" -->").expect("unterminated <!-- file: … -->");
        let path = &rest[..end];
        rest = &rest[end..];
        let open = " -->\n```rust\n";
        assert!(
            rest.starts_with(open),
            "README: <!-- file: {path} --> is not followed by a ```rust block"
        );
        rest = &rest[open.len()..];
        let close = rest.find("\n```\n").expect("unterminated ```rust block");
        let block = &rest[..close + 1];
        let file = std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(
            file, block,
            "{path} differs from its README block: copy the block into the file"
        );
        checked += 1;
    }
    assert_eq!(checked, 4, "README blocks checked");
}
