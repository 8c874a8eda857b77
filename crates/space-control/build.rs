//! Embeds the web console (`console/` at the repository's root) and the JavaScript libraries
//! `scripts/console.sh` vendors from npm (`target/space/console-vendor/`, or
//! `SPACE_CONSOLE_VENDOR`) into the binary: a table of (path, type, entity tag, bytes) that
//! `console.rs` serves. Without the vendored libraries the console is still served; its pages
//! that need them say the libraries are missing (`docs/console.md`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn mime(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "json" => "application/json",
        "woff2" => "font/woff2",
        _ => "application/octet-stream",
    }
}

/// FNV-1a, 64 bits: an entity tag that changes with the bytes.
fn tag(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{h:016x}-{}\"", bytes.len())
}

/// Every file under `dir` (sorted), skipping names in `skip` at the top.
fn walk(dir: &Path, rel: &str, skip: &[&str], out: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || (rel.is_empty() && skip.contains(&name.as_str())) {
            continue;
        }
        let path = e.path();
        let r = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if path.is_dir() {
            walk(&path, &r, skip, out);
        } else {
            out.push((r, path));
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("../..");
    let console = root.join("console");
    let vendor = std::env::var_os("SPACE_CONSOLE_VENDOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/space/console-vendor"));
    println!("cargo:rerun-if-changed={}", console.display());
    println!("cargo:rerun-if-changed={}", vendor.display());
    println!("cargo:rerun-if-env-changed=SPACE_CONSOLE_VENDOR");

    let mut files = Vec::new();
    // The npm project of the vendored libraries and the map for newcomers are not served.
    walk(&console, "", &["vendor", "README.md"], &mut files);
    let mut vendored = Vec::new();
    walk(&vendor, "", &[], &mut vendored);
    files.extend(
        vendored
            .into_iter()
            .map(|(rel, path)| (format!("vendor/{rel}"), path)),
    );
    for (_, path) in &files {
        println!("cargo:rerun-if-changed={}", path.display());
    }

    let mut code = String::from("/// The console's files, by path under `/console/`.\n");
    code.push_str("pub static ASSETS: &[Asset] = &[\n");
    for (rel, path) in &files {
        let bytes = std::fs::read(path).expect("reading a console file");
        let abs = path.canonicalize().expect("a console file's path");
        writeln!(
            code,
            "    Asset {{ path: {rel:?}, mime: {:?}, tag: {:?}, bytes: include_bytes!({:?}) }},",
            mime(rel),
            tag(&bytes),
            abs.display().to_string()
        )
        .expect("writing to a string");
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("console_assets.rs"), code).expect("writing the console's table");
}
