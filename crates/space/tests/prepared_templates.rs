//! Templates prepared in the background (`space up`'s `desktop`): while the image recipe
//! runs, a create of the template is `503 template_not_ready` with the recipe's progress; a
//! recipe that fails says why; one that succeeds makes a template that creates and runs.
//! The recipes here are real programs (shell scripts) whose last line is a real image.

mod in_process;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use space::host::{ImageSource, Recipe};

use in_process::{env_path, server_config, with_data_dir, Api};

fn recipe(script: &str) -> Recipe {
    Recipe {
        image: ImageSource::Recipe("/bin/sh".into(), vec!["-c".into(), script.into()]),
        expected: Duration::from_secs(120),
        vcpus: 1,
        memory_mib: 256,
    }
}

/// The answer to a create of `template`.
async fn create(api: &Api, key: &str, template: &str) -> (u16, serde_json::Value) {
    api.call(
        "POST",
        "/v1/sandboxes",
        Some(key),
        Some(json!({ "template": template })),
    )
    .await
}

/// Polls creates of `template` until `done` accepts the answer (at most `within`).
async fn until(
    api: &Api,
    key: &str,
    template: &str,
    within: Duration,
    done: impl Fn(u16, &serde_json::Value) -> bool,
) -> (u16, serde_json::Value) {
    let started = Instant::now();
    loop {
        let (status, v) = create(api, key, template).await;
        if done(status, &v) {
            return (status, v);
        }
        assert!(
            started.elapsed() < within,
            "{template}: still {status} {v} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn a_template_being_prepared_says_so_and_then_creates() {
    let minimal = env_path("SPACE_ROOTFS_MINIMAL");
    with_data_dir(|data| async move {
        let mut cfg = server_config(&data);
        cfg.prepare = BTreeMap::from([
            (
                "slow".to_owned(),
                recipe("echo '[image] fetching packages' >&2; sleep 600"),
            ),
            (
                "broken".to_owned(),
                recipe("echo '[image] apt-get: the archive is unreachable' >&2; exit 3"),
            ),
            (
                "tiny".to_owned(),
                recipe(&format!(
                    "echo '[image] copying the tree' >&2; sleep 1; echo {}",
                    minimal.display()
                )),
            ),
        ]);
        let server = space::Host::start(cfg).await.expect("starting");
        let key = server.bootstrap_key().unwrap().to_owned();
        let api = Api::new(server.url());

        // Under way: refused with the step the recipe reports, as one to retry.
        let (status, v) = until(&api, &key, "slow", Duration::from_secs(30), |_, v| {
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("fetching packages"))
        })
        .await;
        assert_eq!(status, 503, "{v}");
        assert_eq!(v["error"]["code"], "template_not_ready", "{v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(
            m.contains("being prepared") && m.contains("about 2 min"),
            "{m}"
        );

        // Failed: says why, and nothing was made.
        let (status, v) = until(&api, &key, "broken", Duration::from_secs(30), |_, v| {
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("could not be prepared"))
        })
        .await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (503, Some("template_not_ready"))
        );
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains("the archive is unreachable"), "{m}");

        // Done: the template is there and its sandboxes run.
        let (status, sb) = until(&api, &key, "tiny", Duration::from_secs(300), |s, _| {
            s != 503
        })
        .await;
        assert_eq!(status, 201, "{sb}");
        assert_eq!(sb["template"], "tiny");
        let id = sb["id"].as_str().unwrap().to_owned();
        let (out, _, exit) = api.exec(&key, &id, json!({"shell": "echo prepared"})).await;
        assert_eq!(
            (out.trim(), exit["exit_code"].as_i64()),
            ("prepared", Some(0))
        );
        let templates = api.ok("GET", "/v1/templates", &key, None, 200).await;
        let names: Vec<&str> = templates["templates"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert!(names.contains(&"tiny"), "{templates}");
        assert!(
            !names.contains(&"broken") && !names.contains(&"slow"),
            "{templates}"
        );
        api.ok("DELETE", &format!("/v1/sandboxes/{id}"), &key, None, 200)
            .await;
        server.shutdown().await;
    });
}
