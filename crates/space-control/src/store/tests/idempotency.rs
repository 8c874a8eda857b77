//! Idempotency keys of creates, on both databases.

use super::*;

async fn a_key_names_one_create_per_tenant(db: Db) {
    let store = db.open().await;
    let (acme, other) = (t("acme"), t("other"));
    for name in [&acme, &other] {
        store.create_tenant(name, Quotas::default()).await.unwrap();
    }
    assert_eq!(
        store.begin_create_key(&acme, "k-1", "f1").await.unwrap(),
        CreateKey::Fresh
    );
    // While the first create runs, the same request waits and another one is refused.
    assert_eq!(
        store.begin_create_key(&acme, "k-1", "f1").await.unwrap(),
        CreateKey::Busy
    );
    assert_eq!(
        store.begin_create_key(&acme, "k-1", "f2").await.unwrap(),
        CreateKey::Mismatch
    );
    // Keys are each tenant's own.
    assert_eq!(
        store.begin_create_key(&other, "k-1", "f2").await.unwrap(),
        CreateKey::Fresh
    );
    store
        .finish_create_key(&acme, "k-1", Some("sbx-0011223344556677"))
        .await
        .unwrap();
    assert_eq!(
        store.begin_create_key(&acme, "k-1", "f1").await.unwrap(),
        CreateKey::Done("sbx-0011223344556677".into())
    );
    // A failed create gives its key back; a finished one's key is not given back by a
    // failure reported later.
    store.finish_create_key(&other, "k-1", None).await.unwrap();
    assert_eq!(
        store.begin_create_key(&other, "k-1", "f3").await.unwrap(),
        CreateKey::Fresh
    );
    store.finish_create_key(&acme, "k-1", None).await.unwrap();
    assert_eq!(
        store.begin_create_key(&acme, "k-1", "f1").await.unwrap(),
        CreateKey::Done("sbx-0011223344556677".into())
    );
}

on_both!(a_key_names_one_create_per_tenant);
