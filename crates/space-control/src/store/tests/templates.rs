//! Template owners and builds, on both databases.

use super::*;

async fn template_names_and_builds(db: Db) {
    let store = db.open().await;
    let (acme, other) = (t("acme"), t("other"));
    assert_eq!(store.template_owner("py").await.unwrap(), None);
    store.claim_template("py", &acme).await.unwrap();
    // Claiming again is nothing; another tenant is refused.
    store.claim_template("py", &acme).await.unwrap();
    assert!(matches!(
        store.claim_template("py", &other).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        store.template_owners().await.unwrap(),
        [("py".to_owned(), "acme".to_owned())]
    );
    store.release_template("py").await.unwrap();
    store.claim_template("py", &other).await.unwrap();
    assert_eq!(
        store.template_owner("py").await.unwrap().as_deref(),
        Some("other")
    );

    let row = |id: &str, tenant: &str| BuildRow {
        id: id.into(),
        tenant: tenant.into(),
        name: "py".into(),
        version: "1".into(),
        source: "Dockerfile".into(),
        state: "running".into(),
        error: None,
        log: String::new(),
        created_ms: 0,
        finished_ms: None,
    };
    store.insert_build(&row("bld-1", "acme")).await.unwrap();
    store.insert_build(&row("bld-2", "other")).await.unwrap();
    store.insert_build(&row("bld-3", "acme")).await.unwrap();
    let b = store.build("bld-1").await.unwrap().unwrap();
    assert_eq!((b.state.as_str(), b.finished_ms), ("running", None));
    assert!(b.created_ms > 0);
    store
        .finish_build("bld-1", Some("step 2 failed"), "step 1\nstep 2\n")
        .await
        .unwrap();
    store.finish_build("bld-2", None, "ok\n").await.unwrap();
    let b = store.build("bld-1").await.unwrap().unwrap();
    assert_eq!(b.state, "failed");
    assert_eq!(b.error.as_deref(), Some("step 2 failed"));
    assert_eq!(b.log, "step 1\nstep 2\n");
    assert!(b.finished_ms.is_some());
    assert_eq!(
        store.build("bld-2").await.unwrap().unwrap().state,
        "succeeded"
    );
    let mine: Vec<String> = store
        .builds(Some(&acme), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(mine.len(), 2);
    assert!(mine.iter().all(|id| id != "bld-2"));
    assert_eq!(store.builds(None, 10).await.unwrap().len(), 3);
    // A control plane that starts fails what was left running.
    assert_eq!(store.fail_running_builds("restarted").await.unwrap(), 1);
    let b = store.build("bld-3").await.unwrap().unwrap();
    assert_eq!(
        (b.state.as_str(), b.error.as_deref()),
        ("failed", Some("restarted"))
    );
    // A waiting build (E2B's template request) starts once, with its version and source;
    // a restart leaves it waiting; a build starts nothing but running or waiting.
    let waiting = BuildRow {
        state: "waiting".into(),
        version: String::new(),
        source: "{\"e2b_template_request\":{}}".into(),
        ..row("bld-4", "acme")
    };
    store.insert_build(&waiting).await.unwrap();
    assert!(store
        .insert_build(&BuildRow {
            state: "succeeded".into(),
            ..row("bld-5", "acme")
        })
        .await
        .is_err());
    assert_eq!(store.fail_running_builds("restarted").await.unwrap(), 0);
    assert!(store
        .start_waiting_build("bld-4", "2", "Dockerfile")
        .await
        .unwrap());
    assert!(!store
        .start_waiting_build("bld-4", "3", "Dockerfile")
        .await
        .unwrap());
    assert!(!store
        .start_waiting_build("bld-404", "1", "Dockerfile")
        .await
        .unwrap());
    let b = store.build("bld-4").await.unwrap().unwrap();
    assert_eq!(
        (b.state.as_str(), b.version.as_str(), b.source.as_str()),
        ("running", "2", "Dockerfile")
    );

    // A long log keeps its end.
    let long = "x".repeat(MAX_STORED_LOG + 10) + "end";
    store.finish_build("bld-3", None, &long).await.unwrap();
    let b = store.build("bld-3").await.unwrap().unwrap();
    assert!(b.log.len() <= MAX_STORED_LOG && b.log.ends_with("end"));
    assert!(store.build("bld-none").await.unwrap().is_none());
}

on_both!(template_names_and_builds);
