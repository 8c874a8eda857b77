//! Template builds on real guests: an image archive whose config sets `Env`, `WorkingDir`
//! and `User` gives sandboxes those defaults; a Dockerfile on top of it builds, and a rebuild
//! after editing its last `RUN` takes every earlier step from the cache; a failing `RUN`
//! shows its output and makes no template; a start command with a port check is serving in
//! the first sandbox; a sandbox saved as a template keeps its files and its process.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use space_node::build::BuildPlan;
use space_node::{
    BuildInput, BuildLog, CreateRequest, Node, ReadyCheck, StartSpec, TemplateName, TemplateRef,
    TemplateSource, VersionReq,
};
use space_proto::{ExecSpec, GuestClient};

fn plan(name: &str, source: TemplateSource) -> BuildPlan {
    BuildPlan {
        template: TemplateRef::new(name, "1").unwrap(),
        source,
        kernel: env_path("SPACE_KERNEL"),
        guestd: Some(env_path("SPACE_GUESTD")),
        stock: BTreeMap::new(),
        vcpus: 1,
        memory_mib: 256,
        disk_mib: None,
        start: None,
        ready_timeout: Duration::from_secs(120),
        egress: Default::default(),
    }
}

/// The busybox layout pushed to a registry at `port` as `tools/busybox:t`.
fn push(layout: &Path, port: u16, creds: Option<&str>) -> String {
    let reference = format!("127.0.0.1:{port}/tools/busybox:t");
    let mut cmd = std::process::Command::new("skopeo");
    cmd.args(["copy", "--dest-tls-verify=false", "--insecure-policy"]);
    if let Some(c) = creds {
        cmd.args(["--dest-creds", c]);
    }
    cmd.arg(format!("oci:{}:t", layout.display()))
        .arg(format!("docker://{reference}"));
    space_image::testing::run(&mut cmd);
    reference
}

/// A busybox image (the umoci test image: three layers, `GREETING=hello`, `/opt`, `1000:1000`)
/// as an OCI archive, with busybox under the names the steps call.
fn busybox_archive(dir: &Path) -> PathBuf {
    let busybox = Path::new("/bin/busybox");
    assert!(
        busybox.exists(),
        "busybox-static is needed (scripts/deps.sh)"
    );
    let names = [
        "busybox", "sh", "sync", "mkdir", "cat", "id", "stat", "sleep", "httpd",
    ];
    let files: Vec<(String, &Path, u32)> = names
        .iter()
        .map(|n| (format!("bin/{n}"), busybox, 0o755))
        .collect();
    let extra: Vec<(&str, &Path, u32)> =
        files.iter().map(|(p, s, m)| (p.as_str(), *s, *m)).collect();
    let layout = space_image::testing::make_image_with(dir, &extra);
    let archive = dir.join("image.tar");
    space_image::testing::run(
        std::process::Command::new("skopeo")
            .args(["copy", "--insecure-policy"])
            .arg(format!("oci:{}:t", layout.display()))
            .arg(format!("oci-archive:{}:t", archive.display())),
    );
    archive
}

async fn sh(guest: &GuestClient, line: &str) -> (bool, String) {
    let out = guest.run(ExecSpec::shell(line)).await.unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

async fn sandbox(node: &Node, name: &str) -> (space_node::SandboxId, GuestClient) {
    let id = node
        .create(CreateRequest::new(name.parse::<TemplateName>().unwrap()))
        .await
        .expect("create")
        .id;
    let guest = node.guest(&id).await.unwrap();
    (id, guest)
}

fn dockerfile_source(text: &str, context: &Path) -> TemplateSource {
    TemplateSource::Dockerfile {
        dockerfile: text.to_owned(),
        context: Some(BuildInput::Path(context.to_owned())),
        build_args: BTreeMap::new(),
        credentials: None,
        plain_http: false,
    }
}

#[test]
fn templates_from_a_registry_image_with_credentials() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            let work = tempfile::tempdir().unwrap();
            busybox_archive(work.path());
            let registry = space_image::testing::TestRegistry::start(Some(("agent", "s3cret")));
            let reference = push(
                &work.path().join("oci"),
                registry.port,
                Some("agent:s3cret"),
            );
            let creds = |password: &str| {
                Some(space_node::Credentials {
                    username: "agent".into(),
                    password: password.into(),
                })
            };

            // The image itself, and a Dockerfile on top of it, pulled with the credentials.
            let log = BuildLog::default();
            let source = TemplateSource::Image {
                reference: reference.clone(),
                credentials: creds("s3cret"),
                plain_http: true,
            };
            node.build(plan("pulled", source), &log)
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", log.read(0).text));
            let t = node
                .template(&"pulled".parse().unwrap(), &VersionReq::Latest)
                .unwrap();
            assert!(
                t.manifest.source.contains("@sha256:"),
                "pinned: {}",
                t.manifest.source
            );
            let source = TemplateSource::Dockerfile {
                dockerfile: format!(
                    "FROM {reference}\nUSER root\nRUN echo layered > /opt/layered\n"
                ),
                context: None,
                build_args: BTreeMap::new(),
                credentials: creds("s3cret"),
                plain_http: true,
            };
            let log = BuildLog::default();
            node.build(plan("on-pulled", source), &log)
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", log.read(0).text));
            let (id, guest) = sandbox(&node, "on-pulled").await;
            assert_eq!(
                sh(&guest, "cat /opt/layered; echo $GREETING").await,
                (true, "layered\nhello\n".into())
            );
            node.kill(&id).await.unwrap();

            // Refused credentials, and a name the registry does not have, say so.
            let e = node
                .build(
                    plan(
                        "refused",
                        TemplateSource::Image {
                            reference: reference.clone(),
                            credentials: creds("wrong"),
                            plain_http: true,
                        },
                    ),
                    &BuildLog::default(),
                )
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("refused the credentials"), "{e}");
            let e = node
                .build(
                    plan(
                        "missing",
                        TemplateSource::Image {
                            reference: format!("127.0.0.1:{}/tools/nothing:t", registry.port),
                            credentials: creds("s3cret"),
                            plain_http: true,
                        },
                    ),
                    &BuildLog::default(),
                )
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("tools/nothing"), "{e}");
            assert!(node.templates().unwrap().iter().all(|t| {
                let n = t.manifest.template.name.as_str();
                n != "refused" && n != "missing"
            }));
        },
    );
}

#[test]
fn templates_from_an_image_a_dockerfile_a_start_command_and_a_sandbox() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            let work = tempfile::tempdir().unwrap();
            let archive = busybox_archive(work.path());

            // The image's config is in effect for exec.
            let log = BuildLog::default();
            node.build(
                plan(
                    "img",
                    TemplateSource::Archive {
                        archive: BuildInput::Path(archive),
                        tag: None,
                    },
                ),
                &log,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", log.read(0).text));
            let (id, guest) = sandbox(&node, "img").await;
            assert_eq!(
                sh(&guest, "echo $GREETING; pwd; id -u; id -g").await,
                (true, "hello\n/opt\n1000\n1000\n".into())
            );
            node.kill(&id).await.unwrap();

            // A Dockerfile on top of it, then the same with its last RUN edited.
            let ctx = work.path().join("ctx");
            std::fs::create_dir_all(ctx.join("app")).unwrap();
            std::fs::write(ctx.join("app/hello.txt"), b"hi\n").unwrap();
            std::fs::write(ctx.join("app/secret.key"), b"no\n").unwrap();
            std::fs::write(ctx.join(".dockerignore"), b"**/*.key\n").unwrap();
            let dockerfile = |last: &str| {
                format!(
                    "FROM img\nUSER root\nCOPY --chown=1000:1000 app /app\nENV MODE=prod\n\
                     WORKDIR /app\nRUN echo built-$MODE > stamp\nRUN echo {last} > last\n\
                     USER 1000\n"
                )
            };
            let log = BuildLog::default();
            let mut p = plan("df", dockerfile_source(&dockerfile("one"), &ctx));
            node.build(p.clone(), &log)
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", log.read(0).text));
            let first = log.read(0).text;
            assert!(first.contains("7 steps, 0 from the cache"), "{first}");
            let (id, guest) = sandbox(&node, "df").await;
            assert_eq!(
                sh(&guest, "cat stamp last; stat -c '%u %g' hello.txt; id -u; echo $MODE; test -e secret.key || echo ignored").await,
                (true, "built-prod\none\n1000 1000\n1000\nprod\nignored\n".into())
            );
            node.kill(&id).await.unwrap();
            p.template = TemplateRef::new("df", "2").unwrap();
            p.source = dockerfile_source(&dockerfile("two"), &ctx);
            let log = BuildLog::default();
            node.build(p, &log)
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", log.read(0).text));
            let second = log.read(0).text;
            assert!(second.contains("7 steps, 5 from the cache"), "{second}");
            let t = node
                .template(&"df".parse().unwrap(), &VersionReq::Latest)
                .unwrap();
            assert_eq!(t.manifest.template.version.as_str(), "2");
            let (id, guest) = sandbox(&node, "df").await;
            assert_eq!(sh(&guest, "cat last").await, (true, "two\n".into()));
            node.kill(&id).await.unwrap();

            // A failing RUN: its output in the error, no template.
            let log = BuildLog::default();
            let e = node
                .build(
                    plan(
                        "bad",
                        dockerfile_source("FROM img\nRUN echo about-to-fail; exit 3\n", &ctx),
                    ),
                    &log,
                )
                .await
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("line 2") && e.contains("code 3") && e.contains("about-to-fail"),
                "{e}"
            );
            assert!(node
                .template(&"bad".parse().unwrap(), &VersionReq::Latest)
                .is_err());
            // A missing COPY source names itself and its line before anything runs.
            let e = node
                .build(
                    plan(
                        "bad",
                        dockerfile_source("FROM img\nCOPY nothing /x\n", &ctx),
                    ),
                    &BuildLog::default(),
                )
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("line 2") && e.contains("nothing"), "{e}");

            // A start command whose port is serving in the first sandbox.
            let mut p = plan(
                "srv",
                TemplateSource::Archive {
                    archive: BuildInput::Path(work.path().join("image.tar")),
                    tag: None,
                },
            );
            p.start = Some(StartSpec {
                command: "mkdir -p /tmp/www && echo served > /tmp/www/index.html && httpd -f -p 8000 -h /tmp/www".into(),
                ready: Some(ReadyCheck::Port(8000)),
                timeout_ms: 60_000,
            });
            let log = BuildLog::default();
            node.build(p, &log)
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", log.read(0).text));
            let (id, guest) = sandbox(&node, "srv").await;
            let mut tunnel = guest.tcp(8000).await.expect("port 8000 accepts at once");
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            tunnel
                .write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
                .await
                .unwrap();
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(30), tunnel.read_to_end(&mut answer))
                .await;
            let answer = String::from_utf8_lossy(&answer);
            assert!(
                answer.starts_with("HTTP/1.") && answer.contains("served"),
                "{answer}"
            );

            // Saved: its files and its running process.
            assert!(sh(&guest, "echo kept > /tmp/saved").await.0);
            let keeper = guest.exec(ExecSpec::shell("exec sleep 600")).await.unwrap();
            drop(keeper);
            let saved = TemplateRef::new("saved", "1").unwrap();
            let t = node.save_template(&id, &saved, true).await.unwrap();
            assert_eq!(t.manifest.template, saved);
            // Saved without memory: a write still in the guest's page cache is on the disk (not
            // under /tmp, a tmpfs), and the process is not.
            let as_root = ExecSpec {
                uid: Some(0),
                gid: Some(0),
                ..ExecSpec::shell("echo on-disk > /on-disk")
            };
            assert!(guest.run(as_root).await.unwrap().status.success());
            let cold = TemplateRef::new("saved-disk", "1").unwrap();
            let t = node.save_template(&id, &cold, false).await.unwrap();
            assert!(
                t.manifest.source.starts_with("disk of sandbox"),
                "{}",
                t.manifest.source
            );
            node.kill(&id).await.unwrap();
            let running = |procs: &[space_proto::ProcessInfo]| {
                procs
                    .iter()
                    .any(|p| p.argv.iter().any(|a| a.contains("sleep 600")))
            };
            let (id, guest) = sandbox(&node, "saved").await;
            assert_eq!(sh(&guest, "cat /tmp/saved").await, (true, "kept\n".into()));
            let procs = guest.processes().await.unwrap();
            assert!(running(&procs), "{procs:?}");
            node.kill(&id).await.unwrap();
            let (id, guest) = sandbox(&node, "saved-disk").await;
            assert_eq!(sh(&guest, "cat /on-disk").await, (true, "on-disk\n".into()));
            let procs = guest.processes().await.unwrap();
            assert!(!running(&procs), "{procs:?}");
            node.kill(&id).await.unwrap();
        },
    );
}
