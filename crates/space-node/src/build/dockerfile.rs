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
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_gateway::{spawn_vm_loop, EgressPolicy};
use space_image::dockerfile::{self, ignore::Ignore, Command, Step};
use space_proto::{ExecOutput, ExecSpec, GuestClient, Identity, WriteOptions};
use space_runtime::BootSpec;

use super::cache::{Key, StepCache, StepState};
use super::copy::{collect, hash_items, Item};
use super::import::{self, ImageSource};
use super::{BuildLog, Credentials};
use crate::error::{NodeError, Result};
use crate::ids::{SandboxId, TemplateName, VersionReq};
use crate::sandbox::Ctx;
use crate::template::{self, blocking, GuestDefaults};

/// How long one `RUN` may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(3600);
/// How much of a failing step's output its error shows.
const TAIL_BYTES: usize = 4096;

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

/// The builder VM: booted on a clone of the root image so far, its network through the
/// gateway.
struct Builder {
    vm: Box<dyn space_runtime::NodeVm>,
    client: GuestClient,
    dir: PathBuf,
    ctx: Arc<Ctx>,
    _egress: space_gateway::VmLoop,
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
            let egress = spawn_vm_loop(gateway, dir.clone(), vm.pid(), None);
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
        // The daemon syncs, not a `sync` command: the image need not have one.
        self.client
            .sync()
            .await
            .map_err(|source| NodeError::Guest {
                what: "sync after a step",
                source,
            })?;
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
    fn paths_normalize() {
        assert_eq!(normalize("/a/./b/../c/"), "/a/c");
        assert_eq!(normalize("/../x"), "/x");
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
}
