//! What only PostgreSQL has: replicas migrating at once, connections the server cuts.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_migrate_at_once_and_a_newer_schema_is_refused() {
    let url = test_postgres::database();
    // Replicas starting together: the advisory lock makes one of them migrate.
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { Store::connect(&url).await })
        })
        .collect();
    for o in opens {
        o.await.unwrap().unwrap();
    }
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(store.backend(), "postgres");
    let versions = store
        .read(|c| {
            rows(c, "SELECT version FROM schema_version", args![], |r| {
                r.int(0)
            })
        })
        .await
        .unwrap();
    assert_eq!(versions, [i64::from(schema::PG_SCHEMA_VERSION)]);
    store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    store
        .write(|c| {
            c.execute("UPDATE schema_version SET version = version + 1", args![])?;
            Ok(())
        })
        .await
        .unwrap();
    let err = Store::connect(&url).await.map(|_| ()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    assert!(msg.contains("newer"), "{msg}");
    // Nothing was changed by the refused open.
    assert_eq!(store.tenants().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_cut_by_the_server_are_replaced() {
    let url = test_postgres::database();
    let store = Store::connect(&url).await.unwrap();
    store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    // Every connection of the store is cut, as a database restart would.
    let killer = Store::connect(&url).await.unwrap();
    let cut = killer
        .read(|c| {
            rows(
                c,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                args![],
                |r| r.boolean(0),
            )
        })
        .await
        .unwrap();
    assert!(!cut.is_empty());
    // A call soon after may meet a cut connection and fail; calls after it work.
    let soon = store.tenants().await;
    if let Err(e) = &soon {
        assert!(matches!(e, StoreError::Postgres(_)), "{e:?}");
    }
    assert_eq!(store.tenants().await.unwrap().len(), 1);
    // Connections idle for a while are checked before use, so a cut one never reaches a call.
    killer
        .read(|c| {
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                args![],
            )
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(store.tenants().await.unwrap().len(), 1);
}
