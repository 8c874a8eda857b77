//! A Dockerfile run step by step in a builder VM.
//!
//! The base (`FROM`) is a template of this node's (its pristine root image and defaults), one
//! of the stock images, or an image reference (pulled, made into a root image, and cached by
//! its digest). Every step has a key, its parent's key and the step as parsed (variables
//! expanded), with the names, modes and contents of the files a `COPY` or `ADD` takes; the
//! steps whose keys the cache holds from the top down are not run again. The first step
//! that is not cached boots the builder VM on the root image the cache holds for the step
//! before it (only steps that change files need the VM: a build whose remaining steps only
//! set `ENV`, `USER`, `CMD` and the like boots nothing). The VM's network goes through the
//! node's gateway under the build's egress policy, so `apt-get`, `pip` and `npm` work as they
//! do in a sandbox. After each step the guest syncs, the vCPUs stop, the root image is
//! cloned into the cache, the vCPUs go on.
//!
//! `RUN` runs in the guest under `/bin/sh -c` (or as the exec form says), with the
//! environment, user and working directory the steps so far set; its output goes to the
//! build log as it comes. `COPY` and `ADD` write the files through the guest protocol, owned
//! by root or by `--chown`. `ADD` of a local tar archive (plain, gzip, zstd) unpacks it.
//! Symbolic links in the build context are not copied (the log names them).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use space_image::dockerfile::{self, ignore::Ignore, Command, Step};
use space_proto::{ExecOutput, ExecSpec, GuestClient, Identity, WriteOptions};
use space_runtime::{BootSpec, Runtime, Vm};

use super::cache::{Key, StepCache, StepState};
use super::import::{self, ImageSource};
use super::{BuildLog, Credentials};
use crate::error::{NodeError, Result};
use crate::gateway::{spawn_vm_loop, EgressPolicy};
use crate::ids::{SandboxId, TemplateName, VersionReq};
use crate::sandbox::Ctx;
use crate::template::{self, blocking, GuestDefaults};

/// How long one `RUN` may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(3600);
/// How much of a failing step's output its error shows.
const TAIL_BYTES: usize = 4096;
/// The most a build context may hold.
const MAX_CONTEXT_BYTES: u64 = 8 << 30;

/// What a Dockerfile build needs besides the Dockerfile.
pub struct Env<'a> {
    pub ctx: &'a Arc<Ctx>,
    pub kernel: &'a Path,
    pub guestd: Option<&'a Path>,
    pub stock: &'a BTreeMap<String, PathBuf>,
    pub cache: &'a StepCache,
    /// A scratch directory of the build's.
    pub work: &'a Path,
    pub egress: EgressPolicy,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// The builder's disk, at least.
    pub disk_mib: u64,
    /// For a `FROM` image.
    pub credentials: Option<Credentials>,
    pub plain_http: bool,
}

/// A Dockerfile build.
pub struct Request<'a> {
    pub dockerfile: &'a str,
    /// The build context, a directory; `None`: none (a `COPY` fails).
    pub context: Option<&'a Path>,
    pub build_args: &'a BTreeMap<String, String>,
}

/// What a build made.
#[derive(Debug)]
pub struct Built {
    /// The root image (a cache entry's; clone it before use).
    pub rootfs: PathBuf,
    pub guest: GuestDefaults,
    pub steps: usize,
    pub cached: usize,
    /// `FROM` as resolved.
    pub base: String,
}

fn invalid(msg: impl Into<String>) -> NodeError {
    NodeError::Invalid(msg.into())
}

/// A file a `COPY` writes: where from (on this host) and where to (in the guest).
#[derive(Debug, Clone)]
struct Item {
    src: PathBuf,
    dest: String,
    mode: u32,
    dir: bool,
    /// Owner kept from an unpacked archive (else root or `--chown`).
    owner: Option<(u32, u32)>,
}

/// The base a build starts from.
struct Base {
    rootfs: PathBuf,
    state: StepState,
    key: Key,
    what: String,
}

/// Runs a Dockerfile build (see the module docs).
pub async fn build(env: &Env<'_>, req: &Request<'_>, log: &BuildLog) -> Result<Built> {
    let file =
        dockerfile::parse(req.dockerfile, req.build_args).map_err(|e| invalid(e.to_string()))?;
    let ignore = match req.context {
        Some(dir) => match std::fs::read_to_string(dir.join(".dockerignore")) {
            Ok(text) => Ignore::parse(&text),
            Err(_) => Ignore::parse(""),
        },
        None => Ignore::parse(""),
    };
    // Every COPY source is checked (and hashed) before anything runs.
    let mut copies: BTreeMap<usize, (Vec<Item>, String)> = BTreeMap::new();
    for (line, step) in &file.steps {
        if let Step::Copy {
            sources,
            dest,
            chmod,
            add,
            ..
        } = step
        {
            let what = if *add { "ADD" } else { "COPY" };
            let Some(context) = req.context else {
                return Err(invalid(format!(
                    "Dockerfile line {line}: {what} needs a build context, and the build has none"
                )));
            };
            let items = collect(
                context, &ignore, sources, dest, *chmod, *add, env.work, *line,
            )
            .map_err(|e| match e {
                NodeError::Invalid(m) => invalid(format!("Dockerfile line {line}: {what}: {m}")),
                other => other,
            })?;
            let digest = hash_items(&items)?;
            copies.insert(*line, (items, digest));
        }
    }
    let base = resolve_base(env, &file.from, log).await?;
    log.line(format!("FROM {} ({})", file.from, base.what));
    let total = file.steps.len();
    let mut key = base.key.clone();
    let mut rootfs = base.rootfs.clone();
    let mut state = base.state.clone();
    let mut cached = 0;
    let mut first_uncached = total;
    for (i, (line, step)) in file.steps.iter().enumerate() {
        let next = key.then(&step_text(step, copies.get(line)));
        match env.cache.get(&next) {
            Some(entry) => {
                log.line(format!(
                    "step {}/{total} (line {line}): cached  {}",
                    i + 1,
                    file.texts.get(line).map(String::as_str).unwrap_or("")
                ));
                key = next;
                rootfs = entry.rootfs;
                state = entry.state;
                cached += 1;
            }
            None => {
                first_uncached = i;
                break;
            }
        }
    }
    let mut vm: Option<Builder> = None;
    let result = async {
        for (i, (line, step)) in file.steps.iter().enumerate().skip(first_uncached) {
            let text = file.texts.get(line).map(String::as_str).unwrap_or("");
            log.line(format!("step {}/{total} (line {line}): {text}", i + 1));
            let t0 = Instant::now();
            key = key.then(&step_text(step, copies.get(line)));
            let needs_vm = matches!(step, Step::Run(_) | Step::Copy { .. } | Step::Workdir(_));
            if needs_vm && vm.is_none() {
                vm = Some(Builder::start(env, &rootfs, log).await?);
            }
            apply(&mut state, step)?;
            if let Some(b) = vm.as_ref() {
                match step {
                    Step::Run(cmd) => b.run(cmd, &state, *line, text, log).await?,
                    Step::Copy { chown, .. } => {
                        let items = &copies.get(line).expect("copies were collected").0;
                        b.copy(items, chown.as_deref(), &state, log)
                            .await
                            .map_err(|e| invalid(format!("Dockerfile line {line}: {text}: {e}")))?;
                    }
                    Step::Workdir(_) => {
                        let dir = state.workdir.clone().unwrap_or_else(|| "/".into());
                        b.client.mkdir(&dir, true).await.map_err(|e| {
                            invalid(format!("Dockerfile line {line}: WORKDIR {dir}: {e}"))
                        })?;
                    }
                    _ => {}
                }
                let entry = b.checkpoint(env, &key, &state).await?;
                rootfs = entry.rootfs;
            } else {
                rootfs = env.cache.put(&key, &rootfs, &state)?.rootfs;
            }
            log.line(format!("  done in {:.1} s", t0.elapsed().as_secs_f64()));
        }
        Ok::<_, NodeError>(())
    }
    .await;
    if let Some(b) = vm.take() {
        b.stop().await;
    }
    result?;
    let mut command = state.entrypoint.clone();
    command.extend(state.cmd.iter().cloned());
    Ok(Built {
        rootfs,
        guest: GuestDefaults {
            env: state.env,
            user: state.user,
            workdir: state.workdir,
            command,
            ports: state.ports,
        },
        steps: total,
        cached,
        base: base.what,
    })
}

/// The text a step's key is made of: the step as parsed, and its files' digest.
fn step_text(step: &Step, copy: Option<&(Vec<Item>, String)>) -> String {
    match copy {
        Some((_, digest)) => format!("{step:?} files {digest}"),
        None => format!("{step:?}"),
    }
}

fn argv(c: &Command) -> Vec<String> {
    match c {
        Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
        Command::Exec(v) => v.clone(),
    }
}

/// A path a step names, made absolute against the working directory.
fn absolute(state: &StepState, path: &str) -> String {
    if path.starts_with('/') {
        return path.to_owned();
    }
    let base = state.workdir.as_deref().unwrap_or("/");
    format!("{}/{}", base.trim_end_matches('/'), path)
}

/// What a step changes in the configuration.
fn apply(state: &mut StepState, step: &Step) -> Result<()> {
    match step {
        Step::Env(pairs) => {
            for (k, v) in pairs {
                state.env.insert(k.clone(), v.clone());
            }
        }
        Step::Workdir(dir) => {
            let abs = absolute(state, dir);
            state.workdir = Some(normalize(&abs));
        }
        Step::User(u) => state.user = Some(u.clone()),
        Step::Expose(ports) => {
            for p in ports {
                let (n, proto) = p.split_once('/').unwrap_or((p, "tcp"));
                let n: u16 = n
                    .parse()
                    .map_err(|_| invalid(format!("EXPOSE {p}: not a port")))?;
                if proto.eq_ignore_ascii_case("tcp") && !state.ports.contains(&n) {
                    state.ports.push(n);
                }
            }
        }
        Step::Entrypoint(c) => {
            state.entrypoint = argv(c);
            state.cmd.clear();
        }
        Step::Cmd(c) => state.cmd = argv(c),
        Step::Run(_) | Step::Copy { .. } => {}
    }
    Ok(())
}

/// `/a/./b/../c` as `/a/c`.
fn normalize(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            p => out.push(p),
        }
    }
    format!("/{}", out.join("/"))
}

/// Resolves `FROM`: a template of this node's, a stock image, else an image reference.
async fn resolve_base(env: &Env<'_>, from: &str, log: &BuildLog) -> Result<Base> {
    if let Ok(name) = from.parse::<TemplateName>() {
        if let Ok(t) = template::resolve(&env.ctx.layout, &name, &VersionReq::Latest) {
            let m = &t.manifest;
            return Ok(Base {
                rootfs: t.rootfs(),
                state: StepState {
                    env: m.guest.env.clone(),
                    user: m.guest.user.clone(),
                    workdir: m.guest.workdir.clone(),
                    cmd: m.guest.command.clone(),
                    ports: m.guest.ports.clone(),
                    ..Default::default()
                },
                key: Key::base(&format!("template {} {}", m.template, m.created_unix_ms)),
                what: format!("template {}", m.template),
            });
        }
        if let Some(path) = env.stock.get(from) {
            let meta = std::fs::metadata(path).map_err(NodeError::io("reading", path))?;
            let mtime = meta.mtime();
            return Ok(Base {
                rootfs: path.clone(),
                state: StepState::default(),
                key: Key::base(&format!("stock {from} {} {mtime}", meta.len())),
                what: format!("stock image {from}"),
            });
        }
    }
    let Some(guestd) = env.guestd else {
        return Err(invalid(
            "this node has no space-guestd binary to put into images (SPACE_GUESTD)",
        ));
    };
    let source = ImageSource::Registry {
        reference: from.to_owned(),
        credentials: env.credentials.clone(),
        plain_http: env.plain_http,
    };
    let blobs = env.ctx.layout.root().join("images");
    let fetched = import::fetch(&source, &blobs, log).await?;
    let key = Key::base(&format!("image {}", fetched.digest));
    let guest = fetched.defaults();
    let state = StepState {
        env: guest.env,
        user: guest.user,
        workdir: guest.workdir,
        cmd: guest.command,
        ports: guest.ports,
        ..Default::default()
    };
    let what = fetched.source.clone();
    if let Some(e) = env.cache.get(&key) {
        log.line("root image of the base: cached");
        return Ok(Base {
            rootfs: e.rootfs,
            state,
            key,
            what,
        });
    }
    let imported = import::make_rootfs(fetched, guestd, env.work, 0, log).await?;
    let entry = env.cache.put(&key, &imported.rootfs, &state)?;
    let _ = std::fs::remove_file(&imported.rootfs);
    Ok(Base {
        rootfs: entry.rootfs,
        state,
        key,
        what,
    })
}

/// A relative path of the context, checked: no `..` out of it.
fn context_path(raw: &str) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in Path::new(raw.trim_start_matches('/')).components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(invalid(format!("{raw:?} points outside the build context")));
                }
            }
            Component::Prefix(_) => return Err(invalid(format!("{raw:?} is not a path"))),
        }
    }
    Ok(out)
}

/// Whether `name` matches the wildcard pattern `pat` (`*`, `?`).
fn wildcard(pat: &[u8], name: &[u8]) -> bool {
    match (pat.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            wildcard(&pat[1..], name) || (!name.is_empty() && wildcard(pat, &name[1..]))
        }
        (Some(b'?'), Some(_)) => wildcard(&pat[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => wildcard(&pat[1..], &name[1..]),
        _ => false,
    }
}

/// The context paths a source names: itself, or what its wildcards match (in the last part).
fn expand_source(context: &Path, raw: &str) -> Result<Vec<PathBuf>> {
    let rel = context_path(raw)?;
    let last = rel.file_name().map(|n| n.to_string_lossy().into_owned());
    match last {
        Some(pat) if pat.contains(['*', '?']) => {
            let parent = rel.parent().unwrap_or(Path::new(""));
            let mut out = Vec::new();
            if let Ok(entries) = std::fs::read_dir(context.join(parent)) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if wildcard(pat.as_bytes(), name.as_bytes()) {
                        out.push(parent.join(name));
                    }
                }
            }
            out.sort();
            Ok(out)
        }
        _ => Ok(vec![rel]),
    }
}

/// Whether the first bytes of a file are those of a tar archive (plain or compressed).
fn is_archive(path: &Path) -> bool {
    let mut head = [0u8; 512];
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let n = f.read(&mut head).unwrap_or(0);
    let head = &head[..n];
    head.starts_with(&[0x1f, 0x8b])
        || head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
        || (n >= 262 && &head[257..262] == b"ustar")
}

/// Every file and directory a `COPY` writes, in order (directories first).
#[allow(clippy::too_many_arguments)]
fn collect(
    context: &Path,
    ignore: &Ignore,
    sources: &[String],
    dest: &str,
    chmod: Option<u32>,
    add: bool,
    work: &Path,
    line: usize,
) -> Result<Vec<Item>> {
    let mut matched = Vec::new();
    for raw in sources {
        let found = expand_source(context, raw)?;
        let found: Vec<PathBuf> = found
            .into_iter()
            .filter(|rel| rel.as_os_str().is_empty() || !ignore.is_ignored(&rel.to_string_lossy()))
            .filter(|rel| std::fs::symlink_metadata(context.join(rel)).is_ok())
            .collect();
        if found.is_empty() {
            return Err(invalid(format!(
                "source {raw:?} is not in the build context (or .dockerignore leaves it out)"
            )));
        }
        matched.extend(found);
    }
    let into_dir =
        dest.ends_with('/') || matched.len() > 1 || sources.iter().any(|s| s.contains(['*', '?']));
    let mut items = Vec::new();
    let mut bytes = 0u64;
    let mut unpacked = 0;
    for rel in matched {
        let abs = context.join(&rel);
        let meta = std::fs::symlink_metadata(&abs).map_err(NodeError::io("reading", &abs))?;
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if meta.is_dir() {
            // A directory's contents go into the destination.
            walk(
                context,
                ignore,
                &rel,
                dest.trim_end_matches('/'),
                chmod,
                &mut items,
                &mut bytes,
            )?;
        } else if meta.is_file() {
            if add && is_archive(&abs) {
                let dir = work.join(format!("add-{line}-{unpacked}"));
                unpacked += 1;
                unpack(&abs, &dir)?;
                let before = items.len();
                walk_tree(
                    &dir,
                    Path::new(""),
                    dest.trim_end_matches('/'),
                    chmod,
                    &mut items,
                    &mut bytes,
                    true,
                )?;
                if items.len() == before {
                    return Err(invalid(format!("{name}: the archive holds nothing")));
                }
                continue;
            }
            let target = if into_dir {
                format!("{}/{name}", dest.trim_end_matches('/'))
            } else {
                dest.to_owned()
            };
            bytes += meta.len();
            items.push(Item {
                src: abs,
                dest: target,
                mode: chmod.unwrap_or(meta.permissions().mode() & 0o7777),
                dir: false,
                owner: None,
            });
        }
        if bytes > MAX_CONTEXT_BYTES {
            return Err(invalid(format!(
                "the files are more than {} GiB",
                MAX_CONTEXT_BYTES >> 30
            )));
        }
    }
    Ok(items)
}

fn walk(
    context: &Path,
    ignore: &Ignore,
    rel: &Path,
    dest: &str,
    chmod: Option<u32>,
    items: &mut Vec<Item>,
    bytes: &mut u64,
) -> Result<()> {
    let dir = context.join(rel);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map_err(NodeError::io("listing", &dir))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    items.push(Item {
        src: dir.clone(),
        dest: if dest.is_empty() {
            "/".into()
        } else {
            dest.to_owned()
        },
        mode: 0o755,
        dir: true,
        owner: None,
    });
    for e in entries {
        let child = rel.join(e.file_name());
        if ignore.is_ignored(&child.to_string_lossy()) {
            continue;
        }
        let meta =
            std::fs::symlink_metadata(e.path()).map_err(NodeError::io("reading", e.path()))?;
        let target = format!("{dest}/{}", e.file_name().to_string_lossy());
        if meta.is_dir() {
            walk(context, ignore, &child, &target, chmod, items, bytes)?;
        } else if meta.is_file() {
            *bytes += meta.len();
            items.push(Item {
                src: e.path(),
                dest: target,
                mode: chmod.unwrap_or(meta.permissions().mode() & 0o7777),
                dir: false,
                owner: None,
            });
        } else {
            tracing::debug!(path = %child.display(), "not a file or directory: not copied");
        }
    }
    Ok(())
}

/// An unpacked archive's tree, owners kept.
#[allow(clippy::too_many_arguments)]
fn walk_tree(
    root: &Path,
    rel: &Path,
    dest: &str,
    chmod: Option<u32>,
    items: &mut Vec<Item>,
    bytes: &mut u64,
    top: bool,
) -> Result<()> {
    let dir = root.join(rel);
    let meta = std::fs::metadata(&dir).map_err(NodeError::io("reading", &dir))?;
    if !top {
        items.push(Item {
            src: dir.clone(),
            dest: dest.to_owned(),
            mode: meta.permissions().mode() & 0o7777,
            dir: true,
            owner: Some((meta.uid(), meta.gid())),
        });
    } else {
        items.push(Item {
            src: dir.clone(),
            dest: if dest.is_empty() {
                "/".into()
            } else {
                dest.to_owned()
            },
            mode: 0o755,
            dir: true,
            owner: None,
        });
    }
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map_err(NodeError::io("listing", &dir))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let m = std::fs::symlink_metadata(e.path()).map_err(NodeError::io("reading", e.path()))?;
        let target = format!("{dest}/{}", e.file_name().to_string_lossy());
        if m.is_dir() {
            walk_tree(
                root,
                &rel.join(e.file_name()),
                &target,
                chmod,
                items,
                bytes,
                false,
            )?;
        } else if m.is_file() {
            *bytes += m.len();
            items.push(Item {
                src: e.path(),
                dest: target,
                mode: chmod.unwrap_or(m.permissions().mode() & 0o7777),
                dir: false,
                owner: Some((m.uid(), m.gid())),
            });
        }
    }
    Ok(())
}

fn unpack(archive: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(NodeError::io("creating", dir))?;
    let f = std::fs::File::open(archive).map_err(NodeError::io("opening", archive))?;
    let mut head = std::io::BufReader::new(f);
    let mut budget = import::IMAGE_BUDGET;
    let compression = {
        use std::io::BufRead;
        let buf = head.fill_buf().map_err(NodeError::io("reading", archive))?;
        space_image::Compression::sniff(buf)
    };
    let reader = space_image::layers::decompress(head, compression)
        .map_err(|e| invalid(format!("{}: {e}", archive.display())))?;
    space_image::layers::apply_tar(dir, reader, &mut budget)
        .map_err(|e| invalid(format!("unpacking {}: {e}", archive.display())))?;
    Ok(())
}

/// The digest of what a `COPY` writes: destinations, modes, owners and contents.
fn hash_items(items: &[Item]) -> Result<String> {
    let mut h = Sha256::new();
    for it in items {
        h.update(it.dest.as_bytes());
        h.update([0]);
        h.update(it.mode.to_le_bytes());
        h.update(format!("{:?}", it.owner).as_bytes());
        if it.dir {
            h.update(b"dir");
            continue;
        }
        let mut f = std::fs::File::open(&it.src).map_err(NodeError::io("reading", &it.src))?;
        let mut fh = Sha256::new();
        std::io::copy(&mut f, &mut fh).map_err(NodeError::io("reading", &it.src))?;
        h.update(fh.finalize());
    }
    Ok(hex::encode(h.finalize()))
}

/// The builder VM: booted on a clone of the root image so far, its network through the
/// gateway.
struct Builder {
    vm: space_runtime::QemuVm,
    client: GuestClient,
    dir: PathBuf,
    ctx: Arc<Ctx>,
    _egress: crate::gateway::VmLoop,
}

impl Builder {
    async fn start(env: &Env<'_>, rootfs: &Path, log: &BuildLog) -> Result<Builder> {
        let ctx = env.ctx;
        let id = SandboxId::generate();
        let dir = ctx.layout.sandbox_dir(id.as_str())?;
        let (s, d) = (ctx.storage.clone(), dir.clone());
        blocking(move || Ok(s.create_volume(&d)?)).await?;
        log.line(format!(
            "starting the builder ({} vCPU, {} MiB)",
            env.vcpus, env.memory_mib
        ));
        let booted = async {
            let vm = ctx
                .runtime
                .boot(BootSpec {
                    dir: dir.clone(),
                    kernel: env.kernel.to_owned(),
                    rootfs: rootfs.to_owned(),
                    vcpus: env.vcpus,
                    memory_mib: env.memory_mib,
                    kernel_cmdline: None,
                })
                .await?;
            let gateway = ctx
                .gateway
                .sandbox(id.clone(), env.egress.clone(), Vec::new());
            let egress = spawn_vm_loop(gateway, dir.clone(), vm.pid());
            let started = async {
                let client = vm.wait_ready(ctx.ready_timeout).await?;
                let want = env.disk_mib << 20;
                if vm.disk_bytes().await? < want {
                    vm.resize_disk(want).await?;
                    client
                        .grow_fs("/", Some(want))
                        .await
                        .map_err(|source| NodeError::Guest {
                            what: "growing the builder's disk",
                            source,
                        })?;
                }
                Ok::<_, NodeError>(client)
            }
            .await;
            match started {
                Ok(client) => Ok((vm, client, egress)),
                Err(e) => {
                    let _ = vm.kill().await;
                    Err(e)
                }
            }
        }
        .await;
        match booted {
            Ok((vm, client, egress)) => Ok(Builder {
                vm,
                client,
                dir,
                ctx: ctx.clone(),
                _egress: egress,
            }),
            Err(e) => {
                let (s, d) = (ctx.storage.clone(), dir.clone());
                let _ = blocking(move || Ok(s.delete_volume(&d)?)).await;
                Err(e)
            }
        }
    }

    /// The identity the next command sees: the configuration so far, the deployment CA.
    async fn configure(&self, state: &StepState) -> Result<()> {
        let identity = Identity {
            sandbox_id: "template-builder".to_owned(),
            hostname: Some("builder".to_owned()),
            env: state.env.clone(),
            ca_pem: Some(self.ctx.gateway.ca_pem()),
            user: state.user.clone(),
            workdir: state.workdir.clone(),
            ..Default::default()
        };
        self.client
            .identity(&identity)
            .await
            .map_err(|source| NodeError::Guest {
                what: "the builder's configuration",
                source,
            })?;
        Ok(())
    }

    async fn run(
        &self,
        cmd: &Command,
        state: &StepState,
        line: usize,
        text: &str,
        log: &BuildLog,
    ) -> Result<()> {
        self.configure(state).await?;
        let mut spec = ExecSpec::argv(argv(cmd));
        spec.timeout_ms = Some(RUN_TIMEOUT.as_millis() as u64);
        let guest = |source| NodeError::Guest {
            what: "a RUN step",
            source,
        };
        let mut handle = self.client.exec(spec).await.map_err(|e| match e.proto() {
            Some(p) => invalid(format!("Dockerfile line {line}: {text}: {}", p.message)),
            None => guest(e),
        })?;
        let mut tail: Vec<u8> = Vec::new();
        while let Some(out) = handle.next_output().await.map_err(guest)? {
            let (ExecOutput::Stdout(b) | ExecOutput::Stderr(b)) = out;
            log.write(&String::from_utf8_lossy(&b));
            tail.extend_from_slice(&b);
            if tail.len() > 2 * TAIL_BYTES {
                tail.drain(..tail.len() - TAIL_BYTES);
            }
        }
        let status = handle.wait().await.map_err(guest)?;
        if status.success() {
            return Ok(());
        }
        let why = match (status.exit_code, status.timed_out) {
            (_, true) => format!("ran longer than {} s", RUN_TIMEOUT.as_secs()),
            (Some(c), _) => format!("exited with code {c}"),
            (None, _) => "ended without an exit code".to_owned(),
        };
        let tail =
            String::from_utf8_lossy(&tail[tail.len().saturating_sub(TAIL_BYTES)..]).into_owned();
        Err(invalid(format!(
            "Dockerfile line {line}: {text} {why}; the end of its output:\n{tail}"
        )))
    }

    async fn copy(
        &self,
        items: &[Item],
        chown: Option<&str>,
        state: &StepState,
        log: &BuildLog,
    ) -> std::result::Result<(), String> {
        let owner = match chown {
            Some(spec) => Some(self.owner(spec).await?),
            None => None,
        };
        let mut files = 0u64;
        let mut bytes = 0u64;
        for it in items {
            let dest = normalize(&absolute(state, &it.dest));
            let who = owner.or(it.owner).unwrap_or((0, 0));
            if it.dir {
                self.client
                    .mkdir_owned(&dest, true, Some(who))
                    .await
                    .map_err(|e| format!("{dest}: {e}"))?;
                continue;
            }
            let data = tokio::fs::read(&it.src)
                .await
                .map_err(|e| format!("{}: {e}", it.src.display()))?;
            bytes += data.len() as u64;
            files += 1;
            self.client
                .write_file(
                    &dest,
                    data,
                    WriteOptions {
                        mode: Some(it.mode),
                        create_parents: true,
                        owner: Some(who),
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| format!("{dest}: {e}"))?;
        }
        log.line(format!(
            "  copied {files} files, {} KiB",
            bytes.div_ceil(1024)
        ));
        Ok(())
    }

    /// `--chown`'s `user[:group]` as numbers, names looked up in the guest.
    async fn owner(&self, spec: &str) -> std::result::Result<(u32, u32), String> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let (uid, primary) = match user.parse::<u32>() {
            Ok(n) => (n, n),
            Err(_) => {
                let a = self
                    .client
                    .account(user)
                    .await
                    .map_err(|e| format!("--chown={spec}: {e}"))?;
                (a.uid, a.gid)
            }
        };
        let gid = match group {
            None => primary,
            Some(g) => match g.parse::<u32>() {
                Ok(n) => n,
                Err(_) => {
                    let groups = self
                        .client
                        .read_file_bytes("/etc/group")
                        .await
                        .map_err(|e| format!("--chown={spec}: reading /etc/group: {e}"))?;
                    String::from_utf8_lossy(&groups)
                        .lines()
                        .map(|l| l.split(':').collect::<Vec<_>>())
                        .find(|f| f.len() >= 3 && f[0] == g)
                        .and_then(|f| f[2].parse().ok())
                        .ok_or_else(|| format!("--chown={spec}: no group {g:?} in the image"))?
                }
            },
        };
        Ok((uid, gid))
    }

    /// Syncs the guest, stops the vCPUs, clones the root image into the cache, goes on.
    async fn checkpoint(
        &self,
        env: &Env<'_>,
        key: &Key,
        state: &StepState,
    ) -> Result<super::cache::Entry> {
        let mut sync = ExecSpec::argv(["sync"]);
        sync.timeout_ms = Some(120_000);
        let out = self
            .client
            .run(sync)
            .await
            .map_err(|source| NodeError::Guest {
                what: "sync after a step",
                source,
            })?;
        if !out.status.success() {
            return Err(invalid(format!(
                "`sync` in the builder failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        self.vm.pause().await?;
        let (cache, src, k, st) = (
            env.cache.clone(),
            self.dir.join("rootfs.ext4"),
            key.clone(),
            state.clone(),
        );
        let put = blocking(move || cache.put(&k, &src, &st)).await;
        let resumed = self.vm.resume().await;
        let entry = put?;
        resumed?;
        Ok(entry)
    }

    async fn stop(self) {
        let _ = self.vm.kill().await;
        drop(self.vm);
        let (s, d) = (self.ctx.storage.clone(), self.dir.clone());
        if let Err(e) = blocking(move || Ok(s.delete_volume(&d)?)).await {
            tracing::warn!(error = %e, dir = %self.dir.display(), "removing the builder's directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_and_paths() {
        assert!(wildcard(b"*.txt", b"a.txt"));
        assert!(wildcard(b"a?c", b"abc"));
        assert!(!wildcard(b"*.txt", b"a.txt.bak"));
        assert!(wildcard(b"*", b""));
        assert_eq!(normalize("/a/./b/../c/"), "/a/c");
        assert_eq!(normalize("/../x"), "/x");
        assert_eq!(context_path("./src/../app").unwrap(), PathBuf::from("app"));
        assert!(context_path("../etc/passwd").is_err());
        assert_eq!(context_path("/abs").unwrap(), PathBuf::from("abs"));
    }

    #[test]
    fn steps_change_the_configuration_as_docker_does() {
        let mut s = StepState::default();
        apply(&mut s, &Step::Workdir("/app".into())).unwrap();
        apply(&mut s, &Step::Workdir("sub".into())).unwrap();
        assert_eq!(s.workdir.as_deref(), Some("/app/sub"));
        apply(&mut s, &Step::Cmd(Command::Exec(vec!["serve".into()]))).unwrap();
        apply(&mut s, &Step::Entrypoint(Command::Shell("run".into()))).unwrap();
        assert_eq!(s.entrypoint, ["/bin/sh", "-c", "run"]);
        assert!(s.cmd.is_empty(), "ENTRYPOINT resets CMD");
        apply(
            &mut s,
            &Step::Expose(vec!["8000".into(), "53/udp".into(), "8000/tcp".into()]),
        )
        .unwrap();
        assert_eq!(s.ports, [8000]);
        assert!(apply(&mut s, &Step::Expose(vec!["http".into()])).is_err());
        apply(&mut s, &Step::Env(vec![("A".into(), "1".into())])).unwrap();
        assert_eq!(absolute(&s, "x"), "/app/sub/x");
    }

    #[test]
    fn copy_sources_are_checked_against_the_context() {
        let ctx = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ctx.path().join("src/sub")).unwrap();
        std::fs::write(ctx.path().join("src/a.py"), b"a").unwrap();
        std::fs::write(ctx.path().join("src/sub/b.py"), b"b").unwrap();
        std::fs::write(ctx.path().join("secret.key"), b"k").unwrap();
        std::fs::write(ctx.path().join("x.txt"), b"x").unwrap();
        let ignore = Ignore::parse("*.key\n");
        let c = |sources: &[&str], dest: &str| {
            let s: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
            collect(ctx.path(), &ignore, &s, dest, None, false, work.path(), 1)
        };
        let items = c(&["src"], "/app").unwrap();
        let dests: Vec<&str> = items.iter().map(|i| i.dest.as_str()).collect();
        assert_eq!(dests, ["/app", "/app/a.py", "/app/sub", "/app/sub/b.py"]);
        let items = c(&["x.txt"], "/opt/y.txt").unwrap();
        assert_eq!(items[0].dest, "/opt/y.txt");
        let items = c(&["x.txt"], "/opt/").unwrap();
        assert_eq!(items[0].dest, "/opt/x.txt");
        let items = c(&["*.txt"], "/opt").unwrap();
        assert_eq!(items[0].dest, "/opt/x.txt");
        let e = c(&["missing.txt"], "/").unwrap_err().to_string();
        assert!(
            e.contains("missing.txt") && e.contains("not in the build context"),
            "{e}"
        );
        let e = c(&["secret.key"], "/").unwrap_err().to_string();
        assert!(e.contains(".dockerignore"), "{e}");
        assert!(c(&["../x"], "/").is_err());
        // The digest follows contents.
        let before = hash_items(&c(&["src"], "/app").unwrap()).unwrap();
        std::fs::write(ctx.path().join("src/a.py"), b"changed").unwrap();
        assert_ne!(hash_items(&c(&["src"], "/app").unwrap()).unwrap(), before);
    }
}
