//! Templates through the API, on a real server and real guests: builds are jobs with a
//! status and a log; a tenant's templates are its own; a Dockerfile with an uploaded context
//! builds; a sandbox is saved as a template; bad requests are refused with what is wrong.

use std::time::Duration;

use serde_json::{json, Value};
use space::Host;

mod in_process;

use in_process::{server_config, with_data_dir, Api};

/// Polls a build until it is no longer running.
async fn wait_build(api: &Api, key: &str, id: &str) -> Value {
    for _ in 0..1200 {
        let b = api
            .ok("GET", &format!("/v1/builds/{id}"), key, None, 200)
            .await;
        if b["state"] != "running" {
            return b;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("build {id} did not end");
}

async fn log_of(api: &Api, key: &str, id: &str) -> String {
    let resp = api
        .request("GET", &format!("/v1/builds/{id}/log"), Some(key))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

fn context_tar(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

#[test]
fn templates_of_tenants_builds_and_saves() {
    with_data_dir(|data| async move {
        let mut config = server_config(&data);
        // `base` (Debian, with Python) to build from; not a stock template built at start.
        config
            .images
            .insert("base".into(), in_process::env_path("SPACE_ROOTFS_BASE"));
        let server = Host::start(config).await.expect("starting");
        let admin = server.bootstrap_key().unwrap().to_owned();
        let api = Api::new(server.url());
        let mut keys = Vec::new();
        for name in ["acme", "other"] {
            let t = api
                .ok(
                    "POST",
                    "/v1/tenants",
                    &admin,
                    Some(json!({"name": name})),
                    201,
                )
                .await;
            keys.push(t["key"]["key"].as_str().unwrap().to_owned());
        }
        let (acme, other) = (keys[0].as_str(), keys[1].as_str());

        // Bad requests say what is wrong, before anything runs.
        for (body, needle) in [
            (
                json!({"name": "x", "dockerfile": "FROM minimal\nHEALTHCHECK CMD true\n"}),
                "line 2",
            ),
            (
                json!({"name": "x", "from_image": {"reference": "Not A Ref!"}}),
                "reference",
            ),
            (
                json!({"name": "x", "image": "minimal", "dockerfile": "FROM minimal\n"}),
                "exactly one source",
            ),
            (
                json!({"name": "x", "image": "minimal", "ready_port": 80}),
                "start command",
            ),
            (
                json!({"name": "x", "dockerfile": "FROM minimal\n", "context": "upl-nothing"}),
                "no upload",
            ),
        ] {
            let (s, v) = api
                .call("POST", "/v1/templates", Some(acme), Some(body))
                .await;
            assert_eq!(s, 400, "{v}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains(needle),
                "{v}"
            );
        }
        // A public name takes builds from admins only.
        api.err(
            "POST",
            "/v1/templates",
            Some(acme),
            Some(json!({"name": "minimal", "image": "minimal"})),
            403,
            "forbidden",
        )
        .await;

        // A tenant's build is a job; its template is the tenant's alone.
        let b = api
            .ok(
                "POST",
                "/v1/templates",
                acme,
                Some(json!({"name": "acme-tool", "image": "minimal"})),
                202,
            )
            .await;
        assert_eq!(b["state"], "running");
        let id = b["id"].as_str().unwrap().to_owned();
        let done = wait_build(&api, acme, &id).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let log = log_of(&api, acme, &id).await;
        assert!(log.contains("template acme-tool:1 ready"), "{log}");
        let names = |v: Value| -> Vec<String> {
            v["templates"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect()
        };
        assert!(names(api.ok("GET", "/v1/templates", acme, None, 200).await)
            .contains(&"acme-tool".to_owned()));
        assert!(
            !names(api.ok("GET", "/v1/templates", other, None, 200).await)
                .contains(&"acme-tool".to_owned())
        );
        api.err(
            "GET",
            &format!("/v1/builds/{id}"),
            Some(other),
            None,
            404,
            "build_not_found",
        )
        .await;
        api.err(
            "POST",
            "/v1/sandboxes",
            Some(other),
            Some(json!({"template": "acme-tool"})),
            404,
            "template_not_found",
        )
        .await;
        api.err(
            "POST",
            "/v1/templates",
            Some(other),
            Some(json!({"name": "acme-tool", "image": "minimal"})),
            409,
            "conflict",
        )
        .await;
        let builds = api.ok("GET", "/v1/builds", other, None, 200).await;
        assert!(builds["builds"].as_array().unwrap().is_empty());

        // A Dockerfile with an uploaded context; a failing RUN shows its output.
        let tar = context_tar(&[("greeting.txt", b"hello from the context\n")]);
        let resp = api
            .request("POST", "/v1/template-uploads", Some(acme))
            .header("content-type", "application/octet-stream")
            .body(tar.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let upload: Value = resp.json().await.unwrap();
        let dockerfile = "FROM acme-tool\nENV WHO=tester\nCOPY greeting.txt /srv/\n\
                          WORKDIR /srv\nRUN echo \"$WHO: $(cat greeting.txt)\" > out.txt\n";
        let b = api
            .ok(
                "POST",
                "/v1/templates?wait=true",
                acme,
                Some(json!({"name": "acme-df", "dockerfile": dockerfile, "context": upload["upload"]})),
                202,
            )
            .await;
        assert_eq!(b["state"], "succeeded", "{b}");
        assert_eq!(b["template"]["owner"], "acme");
        assert_eq!(b["template"]["workdir"], "/srv");
        let sb = api.create(acme, "acme-df").await;
        assert_eq!(
            api.sh(acme, &sb, "cat out.txt; echo $WHO").await,
            "tester: hello from the context\ntester\n"
        );
        // An image whose last step takes away every command (busybox, and with it `sync`):
        // the builder's own steps after it need none of the image's tools.
        let bare = api
            .ok(
                "POST",
                "/v1/templates?wait=true",
                acme,
                Some(json!({
                    "name": "acme-bare",
                    "dockerfile": "FROM acme-tool\nRUN echo kept > /kept && rm /bin/busybox\n",
                })),
                202,
            )
            .await;
        assert_eq!(bare["state"], "succeeded", "{bare}");

        let failing = api
            .ok(
                "POST",
                "/v1/templates",
                acme,
                Some(json!({"name": "acme-bad", "dockerfile": "FROM acme-tool\nRUN echo went-wrong >&2; exit 7\n"})),
                202,
            )
            .await;
        let fid = failing["id"].as_str().unwrap().to_owned();
        let done = wait_build(&api, acme, &fid).await;
        assert_eq!(done["state"], "failed");
        let error = done["error"].as_str().unwrap();
        assert!(
            error.contains("code 7") && error.contains("went-wrong"),
            "{error}"
        );
        assert!(log_of(&api, acme, &fid).await.contains("went-wrong"));
        assert!(
            !names(api.ok("GET", "/v1/templates", acme, None, 200).await)
                .contains(&"acme-bad".to_owned())
        );

        // A start command with a port check: the first request after create is answered.
        let web = api
            .ok(
                "POST",
                "/v1/templates?wait=true",
                acme,
                Some(json!({
                    "name": "acme-web",
                    "image": "base",
                    "memory_mib": 512,
                    "start": "mkdir -p /tmp/www && echo serving > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 8000",
                    "ready_port": 8000,
                })),
                202,
            )
            .await;
        assert_eq!(web["template"]["start"]["ready"]["port"], 8000, "{web}");
        let w = api.create(acme, "acme-web").await;
        let resp = api
            .request(
                "GET",
                &format!("/v1/sandboxes/{w}/ports/8000/proxy/index.html"),
                Some(acme),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), "serving\n");
        api.ok("DELETE", &format!("/v1/sandboxes/{w}"), acme, None, 200)
            .await;

        // A sandbox saved as a template: the tenant's, with the sandbox's files.
        api.sh(acme, &sb, "echo saved > /srv/mark").await;
        let t = api
            .ok(
                "POST",
                &format!("/v1/sandboxes/{sb}/template"),
                acme,
                Some(json!({"name": "acme-saved"})),
                201,
            )
            .await;
        assert_eq!(
            (t["name"].as_str(), t["owner"].as_str()),
            (Some("acme-saved"), Some("acme"))
        );
        api.err(
            "POST",
            &format!("/v1/sandboxes/{sb}/template"),
            Some(other),
            Some(json!({"name": "stolen"})),
            404,
            "sandbox_not_found",
        )
        .await;
        let copy = api.create(acme, "acme-saved").await;
        assert_eq!(api.sh(acme, &copy, "cat /srv/mark").await, "saved\n");
        for s in [&sb, &copy] {
            api.ok("DELETE", &format!("/v1/sandboxes/{s}"), acme, None, 200)
                .await;
        }
        server.shutdown().await;
    });
}
