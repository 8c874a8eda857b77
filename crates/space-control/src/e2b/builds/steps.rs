//! The steps of E2B's template builder as a Dockerfile space builds, and the files of its
//! `copy` steps as one build context.

use std::collections::BTreeSet;
use std::io::Read as _;

use serde::Deserialize;
use serde_json::Value;

use super::{valid_hash, E2B_BASE_IMAGE};

/// One step of a build as the SDKs send it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StepBody {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) args: Vec<String>,
    pub(crate) files_hash: Option<String>,
    pub(crate) force: Option<bool>,
}

/// Body of `POST /v2/templates/{id}/builds/{buildID}`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StartBody {
    pub(crate) from_image: Option<String>,
    pub(crate) from_template: Option<String>,
    pub(crate) from_image_registry: Option<Value>,
    pub(crate) force: Option<bool>,
    pub(crate) steps: Vec<StepBody>,
    pub(crate) start_cmd: Option<String>,
    pub(crate) ready_cmd: Option<String>,
}

/// The Dockerfile of `body`'s steps: each `copy` reads from the directory named by its files
/// hash; a forced step (and everything after it) runs again, not from the step cache;
/// `base_user` is the user the base runs steps as (to go back to after a step run as another).
/// Answers the text and the files hashes it reads.
pub fn dockerfile(
    body: &StartBody,
    base_user: &str,
    build_id: &str,
) -> Result<(String, BTreeSet<String>), String> {
    let from = match (&body.from_template, &body.from_image) {
        (Some(t), None) => t.clone(),
        (None, Some(i)) if i == E2B_BASE_IMAGE || i.starts_with("e2bdev/base:") => {
            "base".to_owned()
        }
        (None, Some(i)) => i.clone(),
        (None, None) => return Err("the build names no base: fromImage or fromTemplate".into()),
        (Some(_), Some(_)) => return Err("name one base: fromImage or fromTemplate".into()),
    };
    if from.trim().is_empty() || from.contains(char::is_whitespace) {
        return Err(format!("base {from:?} is not an image or template name"));
    }
    let json = |v: &[String]| serde_json::to_string(v).expect("strings serialize");
    // Words of the exec (JSON) form are expanded, not unquoted: `$` is written `\$`.
    let exec_word = |s: &str| s.replace('$', "\\$");
    // Words of the shell form are unquoted, then expanded: a double-quoted word whose `\`,
    // `"` and `$` are escaped for the first and `$` once more for the second.
    let shell_word = |s: &str| {
        let mut w = String::from('"');
        for c in s.chars() {
            match c {
                '$' => w.push_str("\\\\\\$"),
                '\\' | '"' => {
                    w.push('\\');
                    w.push(c);
                }
                c => w.push(c),
            }
        }
        w.push('"');
        w
    };
    let mut out = format!("FROM {from}\n");
    let mut hashes = BTreeSet::new();
    let mut user = base_user.to_owned();
    let mut forced = body.force == Some(true);
    for (i, step) in body.steps.iter().enumerate() {
        let n = i + 1;
        let arg = |k: usize| step.args.get(k).map(String::as_str).unwrap_or_default();
        if !forced && step.force == Some(true) {
            forced = true;
        }
        if forced && i == 0 || step.force == Some(true) {
            // A command seen by no earlier build: the cache has nothing from here on.
            out.push_str(&format!(
                "RUN {}\n",
                json(&["/bin/sh".into(), "-c".into(), format!(": {build_id}")])
            ));
        }
        if step
            .args
            .iter()
            .any(|a| a.contains('\n') || a.contains('\r'))
            && step.kind != "RUN"
        {
            return Err(format!(
                "step {n} ({}): an argument has a line break",
                step.kind
            ));
        }
        match step.kind.as_str() {
            "RUN" => {
                let cmd = arg(0);
                if cmd.trim().is_empty() {
                    return Err(format!("step {n} (RUN) has no command"));
                }
                let run = format!(
                    "RUN {}\n",
                    json(&["/bin/sh".into(), "-c".into(), cmd.to_owned()])
                );
                match arg(1) {
                    "" => out.push_str(&run),
                    u if u == user => out.push_str(&run),
                    u => {
                        check_word(u, n, "user")?;
                        out.push_str(&format!("USER {u}\n{run}USER {user}\n"));
                    }
                }
            }
            "COPY" => {
                let hash = step
                    .files_hash
                    .as_deref()
                    .filter(|h| valid_hash(h))
                    .ok_or_else(|| format!("step {n} (COPY) has no files hash"))?;
                let (src, dest) = (arg(0), arg(1));
                if src.is_empty() || dest.is_empty() {
                    return Err(format!("step {n} (COPY) needs a source and a destination"));
                }
                if src.starts_with('/') || src.split('/').any(|c| c == "..") {
                    return Err(format!(
                        "step {n} (COPY): {src:?} is not a path inside the context"
                    ));
                }
                hashes.insert(hash.to_owned());
                let mut line = "COPY".to_owned();
                if !arg(2).is_empty() {
                    check_word(arg(2), n, "user")?;
                    line.push_str(&format!(" --chown={}", arg(2)));
                }
                if !arg(3).is_empty() {
                    let mode = arg(3).trim_start_matches('0');
                    let mode = if mode.is_empty() { "0" } else { mode };
                    if u32::from_str_radix(mode, 8).map_or(true, |m| m > 0o7777) {
                        return Err(format!("step {n} (COPY): mode {:?} is not octal", arg(3)));
                    }
                    line.push_str(&format!(" --chmod={mode}"));
                }
                let src = src.trim_start_matches("./");
                line.push_str(&format!(
                    " {}\n",
                    json(&[exec_word(&format!("{hash}/{src}")), exec_word(dest)])
                ));
                out.push_str(&line);
            }
            "ENV" => {
                if step.args.is_empty() || step.args.len() % 2 != 0 {
                    return Err(format!("step {n} (ENV) takes name and value pairs"));
                }
                let mut line = "ENV".to_owned();
                for kv in step.args.chunks(2) {
                    let (k, v) = (&kv[0], &kv[1]);
                    if !valid_env_name(k) {
                        return Err(format!("step {n} (ENV): {k:?} is not a variable name"));
                    }
                    line.push_str(&format!(" {k}={}", shell_word(v)));
                }
                out.push_str(&line);
                out.push('\n');
            }
            "WORKDIR" => {
                let dir = arg(0);
                if dir.is_empty() {
                    return Err(format!("step {n} (WORKDIR) has no directory"));
                }
                out.push_str(&format!("WORKDIR {}\n", shell_word(dir)));
            }
            "USER" => {
                let u = arg(0);
                check_word(u, n, "user")?;
                out.push_str(&format!("USER {u}\n"));
                user = u.to_owned();
            }
            other => {
                return Err(format!(
                    "step {n}: {other:?} is not a step space builds (RUN, COPY, ENV, WORKDIR, USER)"
                ))
            }
        }
    }
    Ok((out, hashes))
}

fn check_word(w: &str, n: usize, what: &str) -> Result<(), String> {
    if w.is_empty()
        || w.len() > 64
        || !w
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-:".contains(&b))
    {
        return Err(format!(
            "step {n}: {what} {w:?} is not a user or user:group name"
        ));
    }
    Ok(())
}

fn valid_env_name(k: &str) -> bool {
    let b = k.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Writes the build context: each files hash's tar (plain or gzip) under a directory named
/// by the hash, to `out`. Entries that leave their directory (absolute, `..`) are refused.
pub(crate) fn merge_contexts(
    parts: &[(String, std::path::PathBuf)],
    out: &std::path::Path,
) -> Result<(), String> {
    let f = std::fs::File::create(out).map_err(|e| format!("creating the context: {e}"))?;
    let mut b = tar::Builder::new(std::io::BufWriter::new(f));
    for (hash, path) in parts {
        let mut raw = std::fs::File::open(path).map_err(|e| format!("files {hash}: {e}"))?;
        let mut magic = [0u8; 2];
        let gz = raw
            .read(&mut magic)
            .map_err(|e| format!("files {hash}: {e}"))?
            == 2
            && magic == [0x1f, 0x8b];
        let raw = std::fs::File::open(path).map_err(|e| format!("files {hash}: {e}"))?;
        let reader: Box<dyn std::io::Read> = if gz {
            Box::new(flate2::read::GzDecoder::new(raw))
        } else {
            Box::new(raw)
        };
        let mut a = tar::Archive::new(reader);
        b.append_dir(hash, std::env::temp_dir())
            .map_err(|e| format!("writing the context: {e}"))?;
        for entry in a.entries().map_err(|e| format!("files {hash}: {e}"))? {
            let mut entry = entry.map_err(|e| format!("files {hash}: {e}"))?;
            let rel = entry
                .path()
                .map_err(|e| format!("files {hash}: {e}"))?
                .into_owned();
            if rel.is_absolute()
                || rel.components().any(|c| {
                    !matches!(
                        c,
                        std::path::Component::Normal(_) | std::path::Component::CurDir
                    )
                })
            {
                return Err(format!(
                    "files {hash}: {} is not a path inside the context",
                    rel.display()
                ));
            }
            let path = std::path::Path::new(hash).join(&rel);
            let mut header = entry.header().clone();
            match header.entry_type() {
                tar::EntryType::Link => {
                    let target = entry
                        .link_name()
                        .map_err(|e| format!("files {hash}: {e}"))?
                        .ok_or_else(|| format!("files {hash}: a hard link without a target"))?
                        .into_owned();
                    if target.is_absolute()
                        || target
                            .components()
                            .any(|c| matches!(c, std::path::Component::ParentDir))
                    {
                        return Err(format!("files {hash}: a hard link leaves the context"));
                    }
                    b.append_link(&mut header, &path, std::path::Path::new(hash).join(target))
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(|e| format!("files {hash}: {e}"))?
                        .ok_or_else(|| format!("files {hash}: a symbolic link without a target"))?
                        .into_owned();
                    b.append_link(&mut header, &path, target)
                }
                tar::EntryType::Regular | tar::EntryType::Directory => {
                    b.append_data(&mut header, &path, &mut entry)
                }
                // Devices, FIFOs, the pax and GNU extension headers (the tar reader has
                // applied the latter to the entries they describe).
                _ => continue,
            }
            .map_err(|e| format!("writing the context: {e}"))?;
        }
    }
    b.into_inner()
        .and_then(|mut w| std::io::Write::flush(&mut w))
        .map_err(|e| format!("writing the context: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_image::dockerfile::{parse, Command, Step};

    fn step(kind: &str, args: &[&str]) -> StepBody {
        StepBody {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn steps_become_a_dockerfile_that_reads_back_as_they_said() {
        let hash = "ab".repeat(32);
        let body = StartBody {
            from_image: Some("e2bdev/base".into()),
            steps: vec![
                step("RUN", &["echo \"$HOME\" && printf 'a\\nb'\nls", "root"]),
                StepBody {
                    files_hash: Some(hash.clone()),
                    ..step("COPY", &["app dir/*.py", "/app/$x\\$/", "user", "0755"])
                },
                step("ENV", &["A", "va\"lue $HOME \\ end \\$", "B", ""]),
                step("WORKDIR", &["/app dir/$HOME"]),
                step("USER", &["user"]),
                step("RUN", &["id"]),
            ],
            ..Default::default()
        };
        let (text, hashes) = dockerfile(&body, "user", "bld-1").unwrap();
        assert_eq!(hashes.into_iter().collect::<Vec<_>>(), vec![hash.clone()]);
        let d = parse(&text, &Default::default()).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(d.from, "base");
        let steps: Vec<&Step> = d.steps.iter().map(|s| &s.1).collect();
        assert_eq!(steps[0], &Step::User("root".into()));
        assert_eq!(
            steps[1],
            &Step::Run(Command::Exec(vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo \"$HOME\" && printf 'a\\nb'\nls".into()
            ]))
        );
        assert_eq!(steps[2], &Step::User("user".into()));
        assert_eq!(
            steps[3],
            &Step::Copy {
                sources: vec![format!("{hash}/app dir/*.py")],
                dest: "/app/$x\\$/".into(),
                chown: Some("user".into()),
                chmod: Some(0o755),
                add: false,
            }
        );
        assert_eq!(
            steps[4],
            &Step::Env(vec![
                ("A".into(), "va\"lue $HOME \\ end \\$".into()),
                ("B".into(), String::new())
            ])
        );
        assert_eq!(steps[5], &Step::Workdir("/app dir/$HOME".into()));
        assert_eq!(steps[6], &Step::User("user".into()));
    }

    #[test]
    fn a_forced_step_and_what_follows_miss_the_cache() {
        let mut body = StartBody {
            from_template: Some("base".into()),
            steps: vec![step("RUN", &["a"]), step("RUN", &["b"])],
            ..Default::default()
        };
        body.steps[1].force = Some(true);
        let (text, _) = dockerfile(&body, "root", "bld-2").unwrap();
        assert_eq!(text.matches("bld-2").count(), 1);
        // Run by the shell (`:` is one of its builtins), like every step.
        let d = parse(&text, &Default::default()).unwrap();
        assert!(d.steps.iter().any(|(_, s)| s
            == &Step::Run(Command::Exec(vec![
                "/bin/sh".into(),
                "-c".into(),
                ": bld-2".into()
            ]))));
        assert!(
            text.find("bld-2").unwrap() > text.find("\"a\"").unwrap(),
            "{text}"
        );
        body.force = Some(true);
        let (text, _) = dockerfile(&body, "root", "bld-3").unwrap();
        assert!(
            text.find("bld-3").unwrap() < text.find("\"a\"").unwrap(),
            "{text}"
        );
    }

    #[test]
    fn bad_steps_are_refused_with_their_number() {
        for (steps, want) in [
            (vec![step("HEALTHCHECK", &["x"])], "step 1"),
            (
                vec![step("RUN", &["a"]), step("COPY", &["a", "/b"])],
                "step 2 (COPY) has no files hash",
            ),
            (vec![step("ENV", &["A"])], "pairs"),
            (vec![step("ENV", &["1A", "x"])], "variable name"),
            (vec![step("USER", &["a b"])], "user"),
            (vec![step("WORKDIR", &["/a\nRUN x"])], "line break"),
        ] {
            let body = StartBody {
                from_template: Some("base".into()),
                steps,
                ..Default::default()
            };
            let e = dockerfile(&body, "root", "b").unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        let e = dockerfile(&StartBody::default(), "root", "b").unwrap_err();
        assert!(e.contains("no base"), "{e}");
        let mut body = StartBody {
            from_template: Some("base".into()),
            steps: vec![step("COPY", &["../etc", "/b"])],
            ..Default::default()
        };
        body.steps[0].files_hash = Some("cd".repeat(32));
        assert!(dockerfile(&body, "root", "b")
            .unwrap_err()
            .contains("inside the context"));
    }

    #[test]
    fn contexts_merge_under_their_hashes_and_refuse_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str, entries: &[(&str, &[u8])], gz: bool| {
            let path = dir.path().join(name);
            let f = std::fs::File::create(&path).unwrap();
            let w: Box<dyn std::io::Write> = if gz {
                Box::new(flate2::write::GzEncoder::new(
                    f,
                    flate2::Compression::fast(),
                ))
            } else {
                Box::new(f)
            };
            let mut b = tar::Builder::new(w);
            for (p, data) in entries {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, p, *data).unwrap();
            }
            b.into_inner().unwrap().flush().unwrap();
            path
        };
        use std::io::Write as _;
        let (h1, h2) = ("a".repeat(64), "b".repeat(64));
        let p1 = make("1.tar", &[("app.py", b"print(1)"), ("d/x.txt", b"x")], true);
        let p2 = make("2.tar", &[("app.py", b"print(2)")], false);
        let out = dir.path().join("ctx.tar");
        merge_contexts(&[(h1.clone(), p1), (h2.clone(), p2)], &out).unwrap();
        let mut a = tar::Archive::new(std::fs::File::open(&out).unwrap());
        let mut seen = std::collections::BTreeMap::new();
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = String::new();
            e.read_to_string(&mut data).unwrap();
            seen.insert(path, data);
        }
        assert_eq!(seen[&format!("{h1}/app.py")], "print(1)");
        assert_eq!(seen[&format!("{h1}/d/x.txt")], "x");
        assert_eq!(seen[&format!("{h2}/app.py")], "print(2)");
        // Written by hand: the tar crate's builder refuses `..` itself.
        let evil = dir.path().join("evil.tar");
        let mut raw = vec![0u8; 512];
        raw[..9].copy_from_slice(b"../escape");
        raw[100..107].copy_from_slice(b"0000644");
        raw[124..135].copy_from_slice(b"00000000000");
        raw[156] = b'0';
        raw[257..263].copy_from_slice(b"ustar\0");
        raw[263..265].copy_from_slice(b"00");
        raw[148..156].copy_from_slice(b"        ");
        let sum: u32 = raw.iter().map(|b| u32::from(*b)).sum();
        raw[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        raw.extend(vec![0u8; 1024]);
        std::fs::write(&evil, raw).unwrap();
        let e = merge_contexts(&[(h1, evil)], &dir.path().join("x.tar")).unwrap_err();
        assert!(e.contains("not a path inside"), "{e}");
    }
}
