//! A tenant's archive through the API, on a real server and real guests, with moto's server as
//! the KMS: a tenant's master key set to a KMS key, a suspend sealed under it, the key disabled
//! (the restore refused with the key named, the sandbox still suspended), enabled again (the
//! restore works), rotated onto a second KMS key (the first can go), every unwrap audited; and
//! the tenant's limit on how long a sandbox may stay suspended.

mod in_process;

use in_process::{server_config, with_data_dir, Api};
use serde_json::json;
use space::Host;
use space_archive::kms::KmsMaster;
use space_archive::testing::Moto;

async fn kms_key(admin: &KmsMaster) -> String {
    admin
        .call("-", "CreateKey", json!({"Description": "tenant key"}))
        .await
        .unwrap()["KeyMetadata"]["KeyId"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn a_tenant_key_held_in_kms() {
    let moto = Moto::start();
    // The server signs its KMS calls with the deployment's AWS credentials.
    std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDSPACETEST");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "space-test-secret");
    let endpoint = moto.endpoint.clone();
    let kms = KmsMaster::new(moto.kms("admin")).unwrap();
    with_data_dir(|data| async move {
        let server = Host::start(server_config(&data)).await.expect("starting");
        let api = Api::new(server.url());
        let key = server.bootstrap_key().unwrap().to_owned();
        let key = key.as_str();
        let k1 = kms_key(&kms).await;
        let k2 = kms_key(&kms).await;
        let set = |k: &str| json!({"provider": "kms", "key_id": k, "region": "us-east-1", "endpoint": endpoint});

        let before = api
            .ok("GET", "/v1/tenants/default/master-key", key, None, 200)
            .await;
        assert_eq!(before["provider"], "deployment");
        let now = api
            .ok(
                "PUT",
                "/v1/tenants/default/master-key",
                key,
                Some(set(&k1)),
                200,
            )
            .await;
        assert_eq!(now["id"], format!("kms:{k1}"));
        let (s, bad) = api
            .call(
                "PUT",
                "/v1/tenants/default/master-key",
                Some(key),
                Some(json!({"provider": "kms", "key_id": ""})),
            )
            .await;
        assert_eq!(s, 400, "{bad}");

        let id = api.create(key, "minimal").await;
        api.sh(key, &id, "echo sealed > /root/kept && sync").await;
        api.ok(
            "POST",
            &format!("/v1/sandboxes/{id}/suspend"),
            key,
            None,
            200,
        )
        .await;

        // Disabled: the restore is refused naming the key; the sandbox stays suspended.
        kms.call("-", "DisableKey", json!({"KeyId": k1}))
            .await
            .unwrap();
        let (s, err) = api
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/restore"),
                Some(key),
                None,
            )
            .await;
        assert_eq!(s, 403, "{err}");
        assert_eq!(err["error"]["code"], "key_unavailable");
        let msg = err["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("kms:{k1}")) && msg.contains("Disabled"),
            "{msg}"
        );
        let info = api
            .ok("GET", &format!("/v1/sandboxes/{id}"), key, None, 200)
            .await;
        assert_eq!(info["state"], "suspended");
        // Wake on access is refused the same way.
        let (s, _) = api
            .call(
                "GET",
                &format!("/v1/sandboxes/{id}/files?path=/root/kept"),
                Some(key),
                None,
            )
            .await;
        assert_eq!(s, 403);

        // Enabled again: it comes back whole.
        kms.call("-", "EnableKey", json!({"KeyId": k1}))
            .await
            .unwrap();
        api.ok(
            "POST",
            &format!("/v1/sandboxes/{id}/restore"),
            key,
            None,
            200,
        )
        .await;
        assert_eq!(api.sh(key, &id, "cat /root/kept").await, "sealed\n");

        // Rotated onto the second key: the first may go.
        let now = api
            .ok(
                "PUT",
                "/v1/tenants/default/master-key",
                key,
                Some(set(&k2)),
                200,
            )
            .await;
        assert_eq!(now["id"], format!("kms:{k2}"));
        kms.call("-", "DisableKey", json!({"KeyId": k1}))
            .await
            .unwrap();
        api.ok(
            "POST",
            &format!("/v1/sandboxes/{id}/suspend"),
            key,
            None,
            200,
        )
        .await;
        api.ok(
            "POST",
            &format!("/v1/sandboxes/{id}/restore"),
            key,
            None,
            200,
        )
        .await;
        assert_eq!(api.sh(key, &id, "cat /root/kept").await, "sealed\n");

        // Every use of the keys is in the audit log, failures included; no key bytes.
        let audit = api.ok("GET", "/v1/audit?limit=1000", key, None, 200).await;
        let events = audit["events"].as_array().unwrap();
        let of = |op: &str, result: &str| {
            events
                .iter()
                .filter(|e| e["operation"] == op && e["result"] == result)
                .count()
        };
        assert!(of("key.unwrap", "ok") >= 2, "{audit}");
        assert!(of("key.unwrap", "key_unavailable") >= 1, "{audit}");
        assert!(of("key.rotate", "ok") >= 1, "{audit}");
        assert_eq!(of("tenant.master_key", "ok"), 2, "{audit}");

        // The tenant's limit on staying suspended: past it, the sandbox is killed and audited.
        let t = api
            .ok(
                "PATCH",
                "/v1/tenants/default",
                key,
                Some(json!({"quotas": {"max_suspended_ms": 1000}})),
                200,
            )
            .await;
        assert_eq!(t["quotas"]["max_suspended_ms"], 1000);
        api.ok(
            "POST",
            &format!("/v1/sandboxes/{id}/suspend"),
            key,
            None,
            200,
        )
        .await;
        assert_eq!(server.expire_suspended().await, 0, "not yet");
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        assert_eq!(server.expire_suspended().await, 1);
        let info = api
            .ok("GET", &format!("/v1/sandboxes/{id}"), key, None, 200)
            .await;
        assert_eq!(info["state"], "terminated");
        let expired = api
            .ok(
                "GET",
                &format!("/v1/audit?sandbox={id}&operation=sandbox.expire"),
                key,
                None,
                200,
            )
            .await;
        assert_eq!(expired["events"].as_array().unwrap().len(), 1, "{expired}");
        // null lifts the limit again.
        let t = api
            .ok(
                "PATCH",
                "/v1/tenants/default",
                key,
                Some(json!({"quotas": {"max_suspended_ms": null}})),
                200,
            )
            .await;
        assert!(t["quotas"]["max_suspended_ms"].is_null());
        server.shutdown().await;
    });
    drop(moto);
}
