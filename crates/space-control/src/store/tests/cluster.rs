//! Nodes, leases, join tokens, reservations, sandbox owners and claims, on both databases.

use super::*;

fn join(id: &str, secret: &str) -> NodeJoin {
    NodeJoin {
        id: id.into(),
        address: format!("{id}.internal:7443"),
        token_hash: keys::hash(secret),
        report: serde_json::json!({"memory_free_mib": 1024}),
    }
}

async fn nodes_join_once_renew_leases_and_are_lost_after_the_grace(db: Db) {
    let store = db.open().await;
    let token = store.create_join_token(60_000).await.unwrap();
    assert!(token.token.starts_with("spacejoin_"));
    let a = store
        .join_node(&token.token, join("node-a", "secret-a"), 1_000)
        .await
        .unwrap();
    assert_eq!(
        (a.incarnation, a.state, a.live),
        (1, NodeState::Active, true)
    );
    // A token works once; a made-up or malformed one never.
    for bad in [
        token.token.clone(),
        format!("spacejoin_{}_{}", "x".repeat(12), "y".repeat(32)),
        "nonsense".into(),
    ] {
        let e = store
            .join_node(&bad, join("node-b", "s"), 1_000)
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Invalid(_)), "{bad}: {e:?}");
    }
    // An expired one neither.
    let expired = store.create_join_token(0).await.unwrap();
    assert!(store
        .join_node(&expired.token, join("node-b", "s"), 1_000)
        .await
        .is_err());
    assert!(store.node("node-b").await.unwrap().is_none());
    // A bad node id is refused before the token is used.
    let t2 = store.create_join_token(60_000).await.unwrap();
    assert!(matches!(
        store.join_node(&t2.token, join("Node_B", "s"), 1_000).await,
        Err(StoreError::Invalid(_))
    ));
    let b = store
        .join_node(&t2.token, join("node-b", "secret-b"), 60_000)
        .await
        .unwrap();
    assert_eq!(b.incarnation, 1);

    // Heartbeats renew; the wrong secret or an old incarnation is refused.
    let report = serde_json::json!({"memory_free_mib": 512});
    let hb = store
        .heartbeat("node-a", 1, "secret-a", &report, 1_000)
        .await
        .unwrap();
    assert!(hb.lease_expires_ms >= a.lease_expires_ms);
    assert_eq!(hb.report, report);
    assert!(store
        .heartbeat("node-a", 1, "secret-b", &report, 1_000)
        .await
        .is_err());
    assert!(store
        .heartbeat("node-a", 2, "secret-a", &report, 1_000)
        .await
        .is_err());

    // node-a stops renewing: once its lease is past the grace it is lost, exactly once.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let now_a = store.node("node-a").await.unwrap().unwrap();
    assert!(!now_a.live);
    let lost = store.mark_lost(100).await.unwrap();
    assert_eq!(
        lost.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        ["node-a"]
    );
    assert!(store.mark_lost(100).await.unwrap().is_empty());
    assert_eq!(
        store.node("node-a").await.unwrap().unwrap().state,
        NodeState::Lost
    );
    // A lost node's heartbeats are refused: it must join again, as a new incarnation.
    assert!(store
        .heartbeat("node-a", 1, "secret-a", &report, 1_000)
        .await
        .is_err());
    let t3 = store.create_join_token(60_000).await.unwrap();
    let again = store
        .join_node(&t3.token, join("node-a", "secret-a2"), 60_000)
        .await
        .unwrap();
    assert_eq!((again.incarnation, again.state), (2, NodeState::Active));
    let ids: Vec<String> = store
        .nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(ids, ["node-a", "node-b"]);
    assert_eq!(
        store
            .set_node_state("node-b", NodeState::Draining)
            .await
            .unwrap()
            .state,
        NodeState::Draining
    );
    assert!(store
        .set_node_state("node-z", NodeState::Removed)
        .await
        .is_err());
}

async fn a_sandbox_moves_only_from_the_owner_and_epoch_it_had(db: Db) {
    let store = std::sync::Arc::new(db.open().await);
    let acme = t("acme");
    store.create_tenant(&acme, Quotas::default()).await.unwrap();
    store.add_sandbox("sbx-1", &acme).await.unwrap();
    assert_eq!(store.sandbox_node("sbx-1").await.unwrap(), None);
    assert_eq!(
        store.move_sandbox("sbx-1", None, "node-a").await.unwrap(),
        Some(1)
    );
    // Placed once: a second first placement loses.
    assert_eq!(
        store.move_sandbox("sbx-1", None, "node-b").await.unwrap(),
        None
    );
    assert_eq!(
        store.sandbox_node("sbx-1").await.unwrap(),
        Some(("node-a".to_string(), 1))
    );
    // Replicas racing to move it: exactly one wins.
    let racers: Vec<_> = ["node-b", "node-c", "node-d", "node-e"]
        .into_iter()
        .map(|to| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .move_sandbox("sbx-1", Some(("node-a", 1)), to)
                    .await
                    .unwrap()
                    .map(|e| (to, e))
            })
        })
        .collect();
    let mut winners = Vec::new();
    for r in racers {
        if let Some(w) = r.await.unwrap() {
            winners.push(w);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let (to, epoch) = winners[0];
    assert_eq!(epoch, 2);
    assert_eq!(
        store.sandbox_node("sbx-1").await.unwrap(),
        Some((to.to_string(), 2))
    );
    assert_eq!(
        store.sandboxes_on(to).await.unwrap(),
        vec![("sbx-1".to_string(), 2)]
    );
    assert!(store.sandboxes_on("node-a").await.unwrap().is_empty());
    assert!(matches!(
        store.move_sandbox("sbx-1", Some((to, 2)), "Bad Node").await,
        Err(StoreError::Invalid(_))
    ));
}

async fn a_move_from_a_lost_node_loses_to_its_rejoin(db: Db) {
    let store = db.open().await;
    let acme = t("acme");
    store.create_tenant(&acme, Quotas::default()).await.unwrap();
    let token = store.create_join_token(60_000).await.unwrap();
    store
        .join_node(&token.token, join("node-a", "secret-a"), 1)
        .await
        .unwrap();
    for id in ["sbx-1", "sbx-2"] {
        store.add_sandbox(id, &acme).await.unwrap();
        store.move_sandbox(id, None, "node-a").await.unwrap();
    }
    // Not lost (yet): the guarded move refuses.
    assert_eq!(
        store
            .move_from_lost("sbx-1", ("node-a", 1), 1, "node-b")
            .await
            .unwrap(),
        None
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lost = store.mark_lost(0).await.unwrap();
    assert_eq!(lost.len(), 1);
    // Lost as incarnation 1: the move wins, and a second one from the old epoch loses.
    assert_eq!(
        store
            .move_from_lost("sbx-1", ("node-a", 1), 1, "node-b")
            .await
            .unwrap(),
        Some(2)
    );
    assert_eq!(
        store
            .move_from_lost("sbx-1", ("node-a", 1), 1, "node-c")
            .await
            .unwrap(),
        None
    );
    // The node rejoins (incarnation 2) before its other sandbox moved: it stays there.
    let back = store
        .rejoin_node(
            "node-a",
            "secret-a",
            "node-a.internal:7443",
            &serde_json::json!({}),
            60_000,
        )
        .await
        .unwrap();
    assert_eq!(back.incarnation, 2);
    assert_eq!(
        store
            .move_from_lost("sbx-2", ("node-a", 1), 1, "node-b")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.sandbox_node("sbx-2").await.unwrap(),
        Some(("node-a".to_string(), 1))
    );
    assert_eq!(
        store.sandbox_node("sbx-1").await.unwrap(),
        Some(("node-b".to_string(), 2))
    );
}

on_both!(
    nodes_join_once_renew_leases_and_are_lost_after_the_grace,
    a_sandbox_moves_only_from_the_owner_and_epoch_it_had,
    a_move_from_a_lost_node_loses_to_its_rejoin,
);

async fn reservations_never_book_more_than_a_node_has(db: Db) {
    let store = std::sync::Arc::new(db.open().await);
    let token = store.create_join_token(60_000).await.unwrap();
    let mut j = join("node-a", "s");
    j.report = serde_json::json!({"memory_free_mib": 1000});
    store.join_node(&token.token, j, 60_000).await.unwrap();
    // Ten replicas ask for 256 MiB each at once: three fit in 1000.
    let asks: Vec<_> = (0..10)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.reserve("node-a", 256, 60_000).await.unwrap() })
        })
        .collect();
    let mut got = Vec::new();
    for a in asks {
        if let Some(id) = a.await.unwrap() {
            got.push(id);
        }
    }
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(store
        .reserve("node-a", 256, 60_000)
        .await
        .unwrap()
        .is_none());
    // A released reservation frees its memory; an unknown or dead node has none to give.
    store.release(&got[0]).await.unwrap();
    assert!(store
        .reserve("node-a", 256, 60_000)
        .await
        .unwrap()
        .is_some());
    assert!(store.reserve("node-z", 1, 60_000).await.unwrap().is_none());
    // Reservations run out by themselves.
    let token = store.create_join_token(60_000).await.unwrap();
    let mut j = join("node-b", "s");
    j.report = serde_json::json!({"memory_free_mib": 300});
    store.join_node(&token.token, j, 60_000).await.unwrap();
    assert!(store.reserve("node-b", 256, 200).await.unwrap().is_some());
    assert!(store.reserve("node-b", 256, 200).await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.reserve("node-b", 256, 200).await.unwrap().is_some());
    // A draining node takes nothing new.
    store
        .set_node_state("node-b", NodeState::Draining)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.reserve("node-b", 1, 200).await.unwrap().is_none());
}

on_both!(reservations_never_book_more_than_a_node_has);

async fn one_holder_per_claim_until_it_runs_out(db: Db) {
    let store = std::sync::Arc::new(db.open().await);
    // Eight replicas claim the same work at once: one gets it.
    let asks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .claim("tenant-key:acme", &format!("r{i}"), 60_000)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut won = 0;
    for a in asks {
        won += usize::from(a.await.unwrap());
    }
    assert_eq!(won, 1);
    // The holder extends it; another holder's release changes nothing; the holder's frees it.
    let mut current = None;
    for i in 0..8 {
        if store
            .claim("tenant-key:acme", &format!("r{i}"), 60_000)
            .await
            .unwrap()
        {
            current = Some(format!("r{i}"));
        }
    }
    let current = current.expect("the holder claims again");
    let other = if current == "r0" { "r1" } else { "r0" };
    store.release_claim("tenant-key:acme", other).await.unwrap();
    assert!(!store.claim("tenant-key:acme", other, 60_000).await.unwrap());
    store
        .release_claim("tenant-key:acme", &current)
        .await
        .unwrap();
    assert!(store.claim("tenant-key:acme", other, 200).await.unwrap());
    // A claim that ran out is taken over.
    assert!(!store.claim("tenant-key:acme", &current, 200).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.claim("tenant-key:acme", &current, 200).await.unwrap());
    // Claims of other names are apart.
    assert!(store.claim("failover:node-a", other, 200).await.unwrap());
}

on_both!(one_holder_per_claim_until_it_runs_out);
