//! Timeouts driven by the node's reconciler: an idle sandbox is suspended (the default
//! action) or killed (when asked), activity through the node keeps one alive, and the
//! maximum lifetime stops a busy one.

mod common;

use std::time::{Duration, Instant};

use common::*;
use space_node::{Node, SandboxId, SandboxOptions, State, TimeoutAction, TimeoutPolicy};

async fn wait_for_state(node: &Node, id: &SandboxId, want: State, within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let state = node.info(id).await.unwrap().state;
        if state == want {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "{id} still {state} after {within:?}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn idle_and_lifetime_timeouts() {
    with_node(
        Disk::Btrfs,
        |cfg| cfg.timeout_tick = Some(Duration::from_millis(100)),
        |node| async move {
            build_minimal(&node, "1").await;
            let idle = |action| SandboxOptions {
                timeouts: TimeoutPolicy {
                    idle: Some(Duration::from_millis(1500)),
                    max_lifetime: None,
                    action,
                },
                ..Default::default()
            };
            // Each sandbox's clock runs from its create, and a create under TCG can take
            // longer than the idle timeout: each is used right after it is made, and the
            // one kept busy is made last.
            let suspend_me = create(&node, idle(TimeoutAction::Suspend)).await;
            let g = node.guest(&suspend_me).await.unwrap();
            let marker = write_random(&g, "/root/marker", 1000).await;
            drop(g);
            let kill_me = create(&node, idle(TimeoutAction::Kill)).await;
            let lifetime = create(
                &node,
                SandboxOptions {
                    timeouts: TimeoutPolicy {
                        idle: None,
                        max_lifetime: Some(Duration::from_secs(3)),
                        action: TimeoutAction::Suspend,
                    },
                    ..Default::default()
                },
            )
            .await;
            let keep_me = create(&node, idle(TimeoutAction::Suspend)).await;

            // Activity through the node keeps `keep_me` running while the others idle out
            // (`lifetime` may reach its maximum meanwhile: activity does not hold it).
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(2500) {
                node.touch(&keep_me).await.unwrap();
                let _ = node.guest(&lifetime).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            wait_for_state(
                &node,
                &suspend_me,
                State::Suspended,
                Duration::from_secs(10),
            )
            .await;
            wait_for_state(&node, &kill_me, State::Terminated, Duration::from_secs(10)).await;
            assert_eq!(node.info(&keep_me).await.unwrap().state, State::Running);
            assert!(!node
                .layout()
                .sandbox_dir(kill_me.as_str())
                .unwrap()
                .exists());

            // The max lifetime stops a sandbox however busy it is.
            let t = Instant::now();
            while node.info(&lifetime).await.unwrap().state == State::Running {
                let _ = node.touch(&lifetime).await;
                assert!(
                    t.elapsed() < Duration::from_secs(15),
                    "max lifetime never fired"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(node.info(&lifetime).await.unwrap().state, State::Suspended);

            // A timed-out sandbox restores with everything, and its idle clock starts over.
            node.restore(&suspend_me).await.unwrap();
            let g = node.guest(&suspend_me).await.unwrap();
            assert_eq!(guest_sha(&g, "/root/marker").await, marker);
            drop(g);
            wait_for_state(
                &node,
                &suspend_me,
                State::Suspended,
                Duration::from_secs(10),
            )
            .await;

            // A paused sandbox idles out too (`keep_me` may have idled out meanwhile).
            if node.info(&keep_me).await.unwrap().state == State::Suspended {
                node.restore(&keep_me).await.unwrap();
            }
            node.pause(&keep_me).await.unwrap();
            assert_eq!(node.info(&keep_me).await.unwrap().state, State::Paused);
            wait_for_state(&node, &keep_me, State::Suspended, Duration::from_secs(10)).await;
        },
    );
}
