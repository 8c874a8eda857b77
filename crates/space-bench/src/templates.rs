//! The templates group (`space-bench templates`): template builds measured on real guests
//! through the node (`docs/images.md`, "Template builds").
//!
//! - a small Dockerfile (`FROM minimal`, a `RUN` with a shell loop standing in for a package
//!   install, a `COPY`, two `RUN`s) built cold (every step runs: the first line differs per
//!   run) and warm (only the last line differs from the build before, so every earlier step
//!   comes from the cache);
//! - the import of an OCI archive with 100 MB of random data in a layer, made into a root
//!   image (fetch and ext4, no VM), in seconds per 100 MB;
//! - create to the first exec from the Dockerfile's template against the stock `minimal`
//!   template, alternating in the same run (they should be the same: both restore a snapshot);
//! - a template saved from a running sandbox (a full snapshot, cloned into the template).

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use space_node::build::{import, BuildPlan};
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{
    BuildLog, CreateRequest, Node, NodeConfig, PoolConfig, TemplateRef, TemplateSource,
    TemplateSpec,
};
use space_proto::ExecSpec;
use space_runtime::accel;

use crate::bench::progress;
use crate::host;
use crate::node::DataDir;
use crate::stats::{Samples, Summary, Table};

const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Iterations of the shell loop in the first step: work a cached step does not redo (a
/// package install, in a real Dockerfile).
const WORK: u32 = 200_000;
/// Bytes of the layer the import measures.
const IMPORT_BYTES: u64 = 100_000_000;

/// What a templates run measures.
pub struct TemplatesPlan {
    pub runs: usize,
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    pub rootfs: PathBuf,
    pub guestd: PathBuf,
}

/// Runs the group; `interrupted` ends it early (cleaned up) with the reason.
pub async fn run(
    plan: &TemplatesPlan,
    interrupted: impl Future<Output = &'static str>,
) -> Result<()> {
    let mut dir = DataDir::with_prefix("space-bench-templates-")?;
    let result = tokio::select! {
        r = measure(plan, &dir) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    let cleaned = tokio::task::block_in_place(|| dir.cleanup());
    crate::bench::with_cleanup(result, cleaned)
}

fn build_plan(
    plan: &TemplatesPlan,
    name: &str,
    version: usize,
    source: TemplateSource,
) -> Result<BuildPlan> {
    Ok(BuildPlan {
        template: TemplateRef::new(name, &version.to_string())?,
        source,
        kernel: plan.kernel.clone(),
        guestd: Some(plan.guestd.clone()),
        stock: BTreeMap::from([("minimal".to_owned(), plan.rootfs.clone())]),
        vcpus: 1,
        memory_mib: 256,
        disk_mib: None,
        start: None,
        ready_timeout: READY_TIMEOUT,
        egress: Default::default(),
    })
}

fn dockerfile(first: &str, last: &str, context: &Path) -> TemplateSource {
    TemplateSource::Dockerfile {
        dockerfile: format!(
            "FROM minimal\nRUN echo {first} > /first && i=0 && while [ $i -lt {WORK} ]; do i=$((i+1)); done\n\
             COPY data.txt /srv/data.txt\nRUN cat /srv/data.txt /first > /srv/both\n\
             RUN echo {last} > /last\n"
        ),
        context: Some(space_node::BuildInput::Path(context.to_owned())),
        build_args: BTreeMap::new(),
        credentials: None,
        plain_http: false,
    }
}

async fn timed_build(node: &Node, p: BuildPlan) -> Result<(Duration, String)> {
    let log = BuildLog::default();
    let t = Instant::now();
    node.build(p, &log)
        .await
        .map_err(|e| anyhow!("{e}\n{}", log.read(0).text))?;
    Ok((t.elapsed(), log.read(0).text))
}

async fn create_to_exec(node: &Node, template: &str) -> Result<Duration> {
    let t = Instant::now();
    let id = node.create(CreateRequest::new(template.parse()?)).await?.id;
    let guest = node.guest(&id).await?;
    let out = guest.run(ExecSpec::shell("true")).await?;
    let took = t.elapsed();
    node.kill(&id).await?;
    if !out.status.success() {
        bail!("`true` failed in a sandbox of {template}");
    }
    Ok(took)
}

/// An OCI archive whose one layer holds `bytes` of random data.
fn big_archive(dir: &Path, bytes: u64) -> Result<PathBuf> {
    use std::io::Write;
    let layout = dir.join("oci");
    let image = format!("{}:t", layout.display());
    let run = |cmd: &mut std::process::Command| -> Result<()> {
        let out = cmd.output().with_context(|| {
            format!("running {cmd:?} (scripts/deps.sh installs umoci and skopeo)")
        })?;
        if !out.status.success() {
            bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    };
    run(std::process::Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout))?;
    run(std::process::Command::new("umoci").args(["new", "--image", &image]))?;
    let bundle = dir.join("bundle");
    run(std::process::Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle))?;
    let data = bundle.join("rootfs/data");
    std::fs::create_dir_all(&data)?;
    let mut rng = std::fs::File::open("/dev/urandom")?;
    let mut left = bytes;
    let mut i = 0;
    while left > 0 {
        let n = left.min(10_000_000);
        let mut f = std::fs::File::create(data.join(format!("part-{i}")))?;
        std::io::copy(&mut (&mut rng).take(n), &mut f)?;
        f.flush()?;
        left -= n;
        i += 1;
    }
    run(std::process::Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle))?;
    let archive = dir.join("big.tar");
    run(std::process::Command::new("skopeo")
        .args(["copy", "--insecure-policy"])
        .arg(format!("oci:{image}"))
        .arg(format!("oci-archive:{}:t", archive.display())))?;
    Ok(archive)
}

async fn measure(plan: &TemplatesPlan, dir: &DataDir) -> Result<()> {
    let mut cfg = NodeConfig::new(dir.data());
    cfg.storage = StorageOptions {
        driver: Some(DriverKind::Btrfs),
        loop_image_size: 32 << 30,
        loop_image: true,
    };
    cfg.qemu.qemu = plan.qemu.clone();
    cfg.qemu.detached = false;
    cfg.ready_timeout = READY_TIMEOUT;
    cfg.rolling.enabled = false;
    cfg.pools = PoolConfig::disabled();
    let node = Node::open(cfg)
        .await
        .context("opening the node (needs root for the loop-mounted btrfs image)")?;
    let result = measure_on(plan, &node).await;
    if tokio::time::timeout(Duration::from_secs(120), node.shutdown())
        .await
        .is_err()
    {
        eprintln!("space-bench: the node did not shut down within 2 minutes");
    }
    result
}

async fn measure_on(plan: &TemplatesPlan, node: &Node) -> Result<()> {
    let decision = accel::detect()?;
    progress("building the stock template minimal");
    node.build_template(TemplateSpec {
        template: TemplateRef::new("minimal", "1")?,
        kernel: plan.kernel.clone(),
        rootfs: plan.rootfs.clone(),
        vcpus: 1,
        memory_mib: 256,
        kernel_cmdline: None,
        ready_timeout: READY_TIMEOUT,
        guest: Default::default(),
        start: None,
        source: "stock minimal".into(),
    })
    .await
    .context("building minimal")?;
    host::print_run_start("space-bench templates", &decision, node.runtime().version());
    println!("host:        {}", host::host_summary());
    println!(
        "runs:        {} (builds are 1 vCPU, 1 GiB builder, 256 MiB template)",
        plan.runs
    );
    println!();

    let context = tempfile::tempdir()?;
    std::fs::write(context.path().join("data.txt"), b"some data\n")?;
    let (mut cold, mut warm) = (Samples::new(), Samples::new());
    let mut version = 0;
    for run in 0..plan.runs {
        progress(&format!("Dockerfile builds, run {}/{}", run + 1, plan.runs));
        version += 1;
        let first = format!("cold-{run}-{}", std::process::id());
        let p = build_plan(plan, "df", version, dockerfile(&first, "a", context.path()))?;
        let (took, log) = timed_build(node, p).await?;
        if !log.contains("4 steps, 0 from the cache") {
            bail!("the cold build took steps from the cache:\n{log}");
        }
        cold.push_duration(took);
        version += 1;
        let p = build_plan(plan, "df", version, dockerfile(&first, "b", context.path()))?;
        let (took, log) = timed_build(node, p).await?;
        if !log.contains("4 steps, 3 from the cache") {
            bail!("the warm build did not take its first steps from the cache:\n{log}");
        }
        warm.push_duration(took);
    }

    let work = tempfile::tempdir_in("/var/tmp")?;
    progress("making an image with 100 MB of random data");
    let archive = tokio::task::block_in_place(|| big_archive(work.path(), IMPORT_BYTES))?;
    let mut import_s = Samples::new();
    for run in 0..plan.runs {
        progress(&format!("import, run {}/{}", run + 1, plan.runs));
        let out = tempfile::tempdir_in(work.path())?;
        let log = BuildLog::default();
        let t = Instant::now();
        let fetched = import::fetch(
            &import::ImageSource::Archive {
                path: archive.clone(),
                tag: None,
            },
            out.path(),
            &log,
        )
        .await?;
        import::make_rootfs(fetched, &plan.guestd, out.path(), 0, &log).await?;
        import_s.push(t.elapsed().as_secs_f64() * (100_000_000.0 / IMPORT_BYTES as f64));
    }

    let (mut custom, mut stock) = (Samples::new(), Samples::new());
    for run in 0..plan.runs {
        progress(&format!(
            "create to first exec, run {}/{}",
            run + 1,
            plan.runs
        ));
        // Alternating which goes first, so neither always follows the other's teardown.
        if run % 2 == 0 {
            custom.push_duration(create_to_exec(node, "df").await?);
            stock.push_duration(create_to_exec(node, "minimal").await?);
        } else {
            stock.push_duration(create_to_exec(node, "minimal").await?);
            custom.push_duration(create_to_exec(node, "df").await?);
        }
    }

    let mut save = Samples::new();
    for run in 0..plan.runs {
        progress(&format!("template save, run {}/{}", run + 1, plan.runs));
        let id = node.create(CreateRequest::new("df".parse()?)).await?.id;
        let t = Instant::now();
        node.save_template(
            &id,
            &TemplateRef::new("saved", &(run + 1).to_string())?,
            true,
        )
        .await?;
        save.push_duration(t.elapsed());
        node.kill(&id).await?;
    }

    let mut t = Table::new("Template builds");
    t.add("Dockerfile build, cold (4 steps run)", "ms", cold.clone());
    t.add("Dockerfile build, warm (last step run)", "ms", warm.clone());
    t.add("image import per 100 MB (fetch + ext4)", "s", import_s);
    t.add("template save of a running sandbox", "ms", save);
    println!("{}", t.render());
    let mut c = Table::new("Create to first exec");
    c.add("from the Dockerfile's template", "ms", custom.clone());
    c.add("from the stock template minimal", "ms", stock.clone());
    println!("{}", c.render());
    let mut s = Summary::new();
    s.add(
        "warm build / cold build",
        &warm,
        &cold,
        "the cache's saving",
    );
    s.add(
        "custom create / stock create",
        &custom,
        &stock,
        "should be ~1.0",
    );
    println!("{}", s.render());
    Ok(())
}
