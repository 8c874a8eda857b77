//! E2B's secrets and their vault rows, changed together, on both databases.

use super::*;
use space_node_api::secrets::SecretKind;

fn sealed(tenant: &TenantName, id: &str, bytes: &[u8], at: u64) -> SecretRow {
    SecretRow {
        tenant: tenant.clone(),
        name: E2bSecretRow::vault_name_of(id),
        hosts: vec!["*".into()],
        nonce: vec![7; 12],
        ciphertext: bytes.to_vec(),
        created_unix_ms: at,
        updated_unix_ms: at,
        kind: SecretKind::Value,
    }
}

async fn e2b_secrets_keep_their_vault_rows(db: Db) {
    let store = db.open().await;
    let (acme, other) = (t("acme"), t("other"));
    for n in [&acme, &other] {
        store.create_tenant(n, Quotas::default()).await.unwrap();
    }
    let row = |id: &str, tenant: &TenantName, name: &str, at: u64| E2bSecretRow {
        id: id.into(),
        tenant: tenant.clone(),
        name: name.into(),
        metadata: r#"{"team":"ml"}"#.into(),
        version: 1,
        created_unix_ms: at,
        updated_unix_ms: at,
    };
    let a = row("aa01", &acme, "openai-key", 10);
    store
        .insert_e2b_secret(&a, &sealed(&acme, "aa01", b"one", 10), 5)
        .await
        .unwrap();
    store
        .insert_e2b_secret(
            &row("aa02", &acme, "second", 20),
            &sealed(&acme, "aa02", b"two", 20),
            5,
        )
        .await
        .unwrap();
    // The same name in another tenant is another secret.
    store
        .insert_e2b_secret(
            &row("bb01", &other, "openai-key", 30),
            &sealed(&other, "bb01", b"x", 30),
            5,
        )
        .await
        .unwrap();
    // A taken name is a conflict and writes nothing.
    let again = store
        .insert_e2b_secret(
            &row("aa03", &acme, "openai-key", 40),
            &sealed(&acme, "aa03", b"dup", 40),
            5,
        )
        .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    assert!(store.secret(&acme, "_E2B_AA03").await.unwrap().is_none());
    // The tenant's vault limit counts every vault secret.
    let full = store
        .insert_e2b_secret(
            &row("aa04", &acme, "third", 50),
            &sealed(&acme, "aa04", b"3", 50),
            2,
        )
        .await;
    assert!(matches!(full, Err(StoreError::Invalid(_))), "{full:?}");
    assert!(store.secret(&acme, "_E2B_AA04").await.unwrap().is_none());
    // An unknown tenant.
    let nobody = store
        .insert_e2b_secret(
            &row("cc01", &t("nobody"), "k", 1),
            &sealed(&t("nobody"), "cc01", b"k", 1),
            5,
        )
        .await;
    assert!(
        matches!(nobody, Err(StoreError::NotFound { .. })),
        "{nobody:?}"
    );

    assert_eq!(
        store
            .e2b_secret(&acme, E2bSecretKey::Id("aa01"))
            .await
            .unwrap(),
        Some(a.clone())
    );
    assert_eq!(
        store
            .e2b_secret(&acme, E2bSecretKey::Name("openai-key"))
            .await
            .unwrap(),
        Some(a.clone())
    );
    assert_eq!(
        store
            .e2b_secret(&other, E2bSecretKey::Id("aa01"))
            .await
            .unwrap(),
        None
    );
    let vault = store.secret(&acme, "_E2B_AA01").await.unwrap().unwrap();
    assert_eq!(vault.ciphertext, b"one");
    assert_eq!(vault.hosts, vec!["*".to_owned()]);
    let names: Vec<String> = store
        .e2b_secrets(&acme)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["openai-key", "second"]);

    // An update: the next version, metadata kept unless given, the vault row replaced.
    let v2 = store
        .update_e2b_secret(&acme, "aa01", &sealed(&acme, "aa01", b"new", 60), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((v2.version, v2.updated_unix_ms), (2, 60));
    assert_eq!(
        (v2.metadata.as_str(), v2.created_unix_ms),
        (r#"{"team":"ml"}"#, 10)
    );
    let v3 = store
        .update_e2b_secret(
            &acme,
            "aa01",
            &sealed(&acme, "aa01", b"newer", 70),
            Some("{}".into()),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!((v3.version, v3.metadata.as_str()), (3, "{}"));
    let vault = store.secret(&acme, "_E2B_AA01").await.unwrap().unwrap();
    assert_eq!(vault.ciphertext, b"newer");
    assert!(store
        .update_e2b_secret(&other, "aa01", &sealed(&other, "aa01", b"z", 80), None)
        .await
        .unwrap()
        .is_none());
    assert!(store.secret(&other, "_E2B_AA01").await.unwrap().is_none());

    // A delete takes the record and its value; another tenant's id deletes nothing.
    assert!(!store.delete_e2b_secret(&other, "aa01").await.unwrap());
    assert!(store.delete_e2b_secret(&acme, "aa01").await.unwrap());
    assert!(!store.delete_e2b_secret(&acme, "aa01").await.unwrap());
    assert!(store.secret(&acme, "_E2B_AA01").await.unwrap().is_none());
    assert!(store.secret(&other, "_E2B_BB01").await.unwrap().is_some());
    assert_eq!(store.e2b_secrets(&acme).await.unwrap().len(), 1);
}

on_both!(e2b_secrets_keep_their_vault_rows);
