//! The KMS master key provider against moto's implementation of the AWS KMS API: create a
//! key, generate a tenant key, open lineages through it, rotate onto another KMS key (ReEncrypt
//! and a rewrap), disable (a clear error naming the key), enable, schedule deletion.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use space_archive::keys::NoAudit;
use space_archive::kms::KmsMaster;
use space_archive::testing::Moto;
use space_archive::{Archive, Keyring, MasterKey, StoreConfig};

async fn create_key(m: &KmsMaster) -> String {
    let v = m
        .call(
            "-",
            "CreateKey",
            json!({"Description": "space test", "KeySpec": "SYMMETRIC_DEFAULT"}),
        )
        .await
        .unwrap();
    v["KeyMetadata"]["KeyId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn kms_master_key_lifecycle() {
    let moto = tokio::task::spawn_blocking(Moto::start).await.unwrap();
    let admin = KmsMaster::new(moto.kms("none")).unwrap();
    let k1 = create_key(&admin).await;
    let k2 = create_key(&admin).await;
    let m1 = Arc::new(KmsMaster::new(moto.kms(&k1)).unwrap());
    let m2 = Arc::new(KmsMaster::new(moto.kms(&k2)).unwrap());

    // Generate, wrap and unwrap with the tenant as context.
    let (key, wrapped) = m1.generate("alice").await.unwrap();
    assert_eq!(m1.unwrap("alice", &wrapped).await.unwrap(), key);
    let err = m1.unwrap("bob", &wrapped).await.unwrap_err();
    assert!(err.to_string().contains("Decrypt refused"), "{err}");
    let rewrapped = m2.wrap("alice", &key).await.unwrap();
    assert_eq!(m2.unwrap("alice", &rewrapped).await.unwrap(), key);
    let moved = m1.reencrypt("alice", &wrapped, &m2).await.unwrap();
    assert_eq!(m2.unwrap("alice", &moved).await.unwrap(), key);

    // A keyring whose tenant key lives under KMS key 1.
    let dir = tempfile::tempdir().unwrap();
    let archive = Archive::open(&StoreConfig::Local(dir.path().join("store")))
        .await
        .unwrap();
    let current: Arc<std::sync::Mutex<Arc<dyn MasterKey>>> =
        Arc::new(std::sync::Mutex::new(m1.clone()));
    struct Current(Arc<std::sync::Mutex<Arc<dyn MasterKey>>>);
    impl space_archive::MasterResolver for Current {
        fn master<'a>(
            &'a self,
            _t: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<Arc<dyn MasterKey>, space_archive::KeyError>>
        {
            let m = self.0.lock().unwrap().clone();
            Box::pin(async move { Ok(m) })
        }
    }
    let ring = Keyring::new(
        archive,
        Arc::new(Current(current.clone())),
        Arc::new(NoAudit),
        Duration::from_secs(60),
    );
    let lk = ring
        .lineage_keys("alice", "lin-1", true, false)
        .await
        .unwrap();
    let id = lk.chunk_id(b"x");

    // Rotation onto key 2 rewraps one object; the lineage keys stay the same.
    ring.rotate("alice", m1.as_ref(), m2.as_ref())
        .await
        .unwrap();
    *current.lock().unwrap() = m2.clone();
    assert_eq!(
        ring.lineage_keys("alice", "lin-1", false, true)
            .await
            .unwrap()
            .chunk_id(b"x"),
        id
    );

    // Disabled: restores fail with the key named; enabled again: they work.
    admin
        .call("-", "DisableKey", json!({"KeyId": k2}))
        .await
        .unwrap();
    let err = ring
        .lineage_keys("alice", "lin-1", false, true)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("kms:{k2}")) && msg.contains("Disabled"),
        "{msg}"
    );
    // Rotating away from a disabled key is refused too (nothing is rewritten).
    assert!(ring
        .rotate("alice", m2.as_ref(), m1.as_ref())
        .await
        .is_err());
    admin
        .call("-", "EnableKey", json!({"KeyId": k2}))
        .await
        .unwrap();
    ring.lineage_keys("alice", "lin-1", false, true)
        .await
        .unwrap();

    // Scheduled for deletion: refused too.
    admin
        .call(
            "-",
            "ScheduleKeyDeletion",
            json!({"KeyId": k2, "PendingWindowInDays": 7}),
        )
        .await
        .unwrap();
    let err = ring
        .lineage_keys("alice", "lin-1", false, true)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&format!("kms:{k2}")), "{err}");
    assert!(err.to_string().contains("PendingDeletion"), "{err}");
}
