//! The test server's configuration and a data directory torn down in the right order even
//! after a panic, shared by the API's integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use space::{Host, HostConfig};
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{Node, NodeConfig};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

// The throwaway PostgreSQL server, shared with the store's own tests.
#[path = "../../../space-control/tests/common/postgres.rs"]
pub mod postgres;

/// Which database the test servers keep their state in: `SPACE_TEST_STORE=postgres` runs the
/// suite against a throwaway PostgreSQL server, anything else (or unset) against SQLite in
/// the data directory, as `space up` does.
pub fn test_database() -> Option<String> {
    match std::env::var("SPACE_TEST_STORE").as_deref() {
        Ok("postgres") => Some(postgres::database()),
        Ok("sqlite") | Ok("") | Err(_) => None,
        Ok(other) => panic!("SPACE_TEST_STORE={other}: expected sqlite or postgres"),
    }
}

/// Whether the test servers reach their node through the network node API:
/// `SPACE_TEST_NODE=remote` (mutual TLS on loopback), else in process as `space up` does.
pub fn test_node_over_network() -> bool {
    match std::env::var("SPACE_TEST_NODE").as_deref() {
        Ok("remote") => true,
        Ok("local") | Ok("") | Err(_) => false,
        Ok(other) => panic!("SPACE_TEST_NODE={other}: expected local or remote"),
    }
}

/// Uploads above this are refused by the test server.
pub const MAX_UPLOAD: u64 = 2 << 20;

pub fn env_path(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => panic!(
            "{var} is not set: these tests boot real guests; `source target/space/env.sh` first \
             (or run `make test`)"
        ),
    }
}

pub fn server_config(data: &Path) -> HostConfig {
    let mut cfg = HostConfig::new(node_config(data), env_path("SPACE_KERNEL"));
    cfg.server.listen = "127.0.0.1:0".parse().unwrap();
    cfg.images = BTreeMap::from([("minimal".to_string(), env_path("SPACE_ROOTFS_MINIMAL"))]);
    cfg.stock_templates = vec!["minimal".into()];
    cfg.server.max_upload_bytes = MAX_UPLOAD;
    // Suspended sandboxes go to a directory store, and their local copies are evicted at once:
    // every restore below comes from the store.
    let mut archive = space_control::archive::ArchiveSettings::new(
        space_archive::StoreConfig::Local(data.with_extension("objects")),
    );
    archive.cache_max_bytes = Some(0);
    archive.upload_interval = None;
    cfg.server.archive = Some(archive);
    cfg.server.database = test_database();
    cfg.node_over_network = test_node_over_network();
    cfg
}

/// The test server's node: btrfs on a loop image, no pools, no rolling snapshots.
pub fn node_config(data: &Path) -> NodeConfig {
    let mut node = NodeConfig::new(data);
    node.storage = StorageOptions {
        driver: Some(DriverKind::Btrfs),
        loop_image_size: 8 << 30,
        loop_image: true,
    };
    node.ready_timeout = Duration::from_secs(120);
    node.pools = space_node::PoolConfig::disabled();
    node.rolling.enabled = false;
    node
}

/// Runs `test` on its own runtime, then tears down in an order that works after a panic
/// too: the runtime (its tasks own the VMs a driver still holds), then a fresh node on the
/// data directory that adopts and kills whatever VMs were left detached, then the loop
/// mount and the temp dir.
pub fn with_data_dir<F, Fut>(test: F)
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: Future<Output = ()>,
{
    with_data_dirs(1, |mut dirs| test(dirs.remove(0)));
}

/// [`with_data_dir`] with a server started on it: `test` gets a client of the server and the
/// admin key its first start made; the server is shut down after it.
pub fn with_server<F, Fut>(test: F)
where
    F: FnOnce(Api, String) -> Fut,
    Fut: Future<Output = ()>,
{
    with_data_dir(|data| async move {
        let server = Host::start(server_config(&data)).await.expect("starting");
        let admin = server
            .bootstrap_key()
            .expect("first start makes a key")
            .to_owned();
        test(Api::new(server.url()), admin).await;
        server.shutdown().await;
    });
}

/// [`with_data_dir`] for `count` data directories (several nodes in one test).
pub fn with_data_dirs<F, Fut>(count: usize, test: F)
where
    F: FnOnce(Vec<PathBuf>) -> Fut,
    Fut: Future<Output = ()>,
{
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG")
                .unwrap_or_else(|_| "space_control=info,space_node=warn".into()),
        )
        .with_test_writer()
        .try_init();
    let tmp = tempfile::Builder::new()
        .prefix("space-control-test")
        .tempdir_in("/var/tmp")
        .unwrap();
    let dirs: Vec<PathBuf> = (0..count)
        .map(|i| {
            if count == 1 {
                tmp.path().join("data")
            } else {
                tmp.path().join(format!("data{i}"))
            }
        })
        .collect();
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let runtime = rt();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(test(dirs.clone()))
    }));
    drop(runtime);
    for data in &dirs {
        if data.join("state").exists() {
            let mut cfg = node_config(data);
            cfg.auto_restore = false;
            cfg.timeout_tick = None;
            rt().block_on(async {
                match Node::open(cfg).await {
                    Ok(node) => node.shutdown().await,
                    Err(e) => eprintln!("reopening the node to clean up: {e}"),
                }
            });
        }
        unmount(data);
    }
    drop(tmp);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

pub fn unmount(data: &Path) {
    use std::os::unix::fs::MetadataExt;
    let (Ok(a), Ok(b)) = (
        std::fs::metadata(data),
        std::fs::metadata(data.parent().unwrap()),
    ) else {
        return;
    };
    if a.dev() == b.dev() {
        return;
    }
    if nix::mount::umount2(data, nix::mount::MntFlags::empty()).is_err() {
        nix::mount::umount2(data, nix::mount::MntFlags::MNT_DETACH).expect("unmounting");
    }
}

/// A client of one server.
#[derive(Clone)]
pub struct Api {
    pub url: String,
    http: reqwest::Client,
}

impl Api {
    pub fn new(url: String) -> Api {
        Api {
            url,
            http: reqwest::Client::new(),
        }
    }

    pub fn request(&self, method: &str, path: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut rb = self.http.request(m, format!("{}{path}", self.url));
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        rb
    }

    /// Sends a request (JSON body if given); returns the status and the JSON answer (or
    /// `Null` for an empty or non-JSON one).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut rb = self.request(method, path, key);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb.send().await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Like `call`, insisting on `want`.
    pub async fn ok(
        &self,
        method: &str,
        path: &str,
        key: &str,
        body: Option<Value>,
        want: u16,
    ) -> Value {
        let (status, v) = self.call(method, path, Some(key), body).await;
        assert_eq!(status, want, "{method} {path}: {v}");
        v
    }

    /// Like `call`, insisting on an error with `status` and `code`; returns the message.
    pub async fn err(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
        status: u16,
        code: &str,
    ) -> String {
        let (s, v) = self.call(method, path, key, body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{method} {path}: {v}"
        );
        v["error"]["message"].as_str().unwrap().to_owned()
    }

    /// Creates a sandbox of `template` (answered `201`); returns its id.
    pub async fn create(&self, key: &str, template: &str) -> String {
        let sb = self
            .ok(
                "POST",
                "/v1/sandboxes",
                key,
                Some(serde_json::json!({ "template": template })),
                201,
            )
            .await;
        sb["id"]
            .as_str()
            .expect("a create names the sandbox")
            .to_owned()
    }

    /// Creates, with the admin key `admin`, the sandbox the end-to-end checks work on (`minimal`
    /// with an environment variable, metadata `owner=agent-7` and an hour's lifetime), and
    /// checks that the answer says all of it back; returns its id.
    pub async fn create_described(&self, admin: &str) -> String {
        let sb = self
            .ok(
                "POST",
                "/v1/sandboxes",
                admin,
                Some(json!({
                    "template": "minimal",
                    "env": {"GREETING": "hello-env"},
                    "metadata": {"owner": "agent-7"},
                    "timeouts": {"idle_ms": null, "max_lifetime_ms": 3_600_000},
                })),
                201,
            )
            .await;
        assert_eq!(sb["state"], "running");
        assert_eq!(sb["tenant"], "default");
        assert_eq!(sb["template"], "minimal");
        assert_eq!(sb["template_version"], "1");
        assert_eq!(sb["metadata"]["owner"], "agent-7");
        assert_eq!(
            sb["timeouts"],
            json!({"idle_ms": null, "max_lifetime_ms": 3_600_000, "action": "suspend"})
        );
        assert_eq!(sb["forked_from"], Value::Null);
        sb["id"].as_str().unwrap().to_owned()
    }

    /// The server's `/metrics` text (no key needed).
    pub async fn metrics(&self) -> String {
        self.request("GET", "/metrics", None)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Runs an exec through the NDJSON route; returns (stdout, stderr, exit line).
    pub async fn exec(&self, key: &str, id: &str, req: Value) -> (String, String, Value) {
        let resp = self
            .request("POST", &format!("/v1/sandboxes/{id}/exec"), Some(key))
            .json(&req)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "exec {req}");
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "application/x-ndjson"
        );
        let text = resp.text().await.unwrap();
        let events = space_api::exec::events(text.as_bytes()).unwrap();
        assert!(
            matches!(events[0], space_api::ExecEvent::Started { pid } if pid > 0),
            "{text}"
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for ev in &events[1..events.len() - 1] {
            match ev {
                space_api::ExecEvent::Stdout { data } => out.extend_from_slice(data),
                space_api::ExecEvent::Stderr { data } => err.extend_from_slice(data),
                other => panic!("unexpected event {other:?}: {text}"),
            }
        }
        let last = events.last().unwrap();
        assert!(matches!(last, space_api::ExecEvent::Exit { .. }), "{text}");
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
            serde_json::to_value(last).unwrap(),
        )
    }

    /// Shell line that must succeed; returns stdout.
    pub async fn sh(&self, key: &str, id: &str, line: &str) -> String {
        let (out, err, exit) = self.exec(key, id, json!({ "shell": line })).await;
        assert_eq!(exit["exit_code"], 0, "`{line}`: {err}");
        out
    }

    pub async fn ws(
        &self,
        key: &str,
        path: &str,
    ) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>
    {
        let url = format!("{}{path}", self.url.replacen("http://", "ws://", 1));
        let mut req = url.into_client_request().unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
        let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        ws
    }
}
