//! What the control plane gives the node's egress gateway: the secret values of the vault
//! ([`VaultSecrets`], a [`SecretSource`]) and a sink for its audit events ([`AuditSink`], an
//! [`EgressAudit`] that never blocks the gateway).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};

use space_node_api::secrets::{EgressAudit, EgressEvent, SecretSource, SecretValue};
use space_node_api::SandboxId;

use crate::metrics::Metrics;
use crate::store::{NewAuditEvent, Store, TenantName};
use crate::vault::Vault;

/// Audit events queued for the writer before new ones are dropped (and counted).
pub const AUDIT_QUEUE: usize = 4096;

/// Secret values for the gateway: the sandbox's owner is looked up, then the secret of that
/// tenant is decrypted. A sandbox no tenant owns has no secrets.
///
/// The node (and its gateway) opens before the state store, because opening the node may
/// mount the data directory; so the source is made empty and [`VaultSecrets::connect`]ed to
/// the store and the vault right after. Until then it has no values.
#[derive(Debug, Default)]
pub struct VaultSecrets {
    inner: OnceLock<(Arc<Store>, Arc<Vault>)>,
}

impl VaultSecrets {
    /// A source that has no values until [`VaultSecrets::connect`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Connects the source to `vault`, with ownership from `store` (the first call wins).
    pub fn connect(&self, store: Arc<Store>, vault: Arc<Vault>) {
        let _ = self.inner.set((store, vault));
    }

    async fn lookup(&self, sandbox: &SandboxId, name: &str) -> Option<SecretValue> {
        let (store, vault) = self.inner.get()?;
        let tenant = match store.sandbox_tenant(sandbox.as_str()).await {
            Ok(Some(t)) => t,
            Ok(None) => return None,
            Err(e) => {
                tracing::error!(%sandbox, error = %e, "looking up a sandbox's owner for a secret");
                return None;
            }
        };
        match vault.value(&tenant, name).await {
            Ok(Some(stored)) => stored.current(),
            Ok(None) => None,
            Err(e) => {
                tracing::error!(%sandbox, secret = name, error = %e, "reading a secret");
                None
            }
        }
    }
}

impl SecretSource for VaultSecrets {
    fn value<'a>(
        &'a self,
        sandbox: &'a SandboxId,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<SecretValue>> + Send + 'a>> {
        Box::pin(self.lookup(sandbox, name))
    }
}

/// The gateway's audit events, queued (bounded) to a writer thread that records them in the
/// sandbox's tenant. When the queue is full an event is dropped, counted in `/metrics`
/// (`space_egress_audit_dropped_total`) and logged.
#[derive(Debug)]
pub struct AuditSink {
    tx: SyncSender<EgressEvent>,
    metrics: Arc<Metrics>,
    dropped_logged: AtomicU64,
}

/// The receiving end of an [`AuditSink`], until its writer thread starts.
#[derive(Debug)]
pub struct AuditWriter {
    rx: Receiver<EgressEvent>,
}

impl AuditSink {
    /// A sink whose events queue until [`AuditWriter::start`] (the node opens before the
    /// store; events of that moment wait in the queue).
    pub fn new(metrics: Arc<Metrics>) -> (AuditSink, AuditWriter) {
        let (tx, rx) = sync_channel(AUDIT_QUEUE);
        let sink = AuditSink {
            tx,
            metrics,
            dropped_logged: AtomicU64::new(0),
        };
        (sink, AuditWriter { rx })
    }
}

impl AuditWriter {
    /// Starts the writer thread over `store`; it ends when the sink is dropped. Called on
    /// the runtime, whose handle the thread uses to reach the store.
    pub fn start(self, store: Arc<Store>) -> std::io::Result<()> {
        let rt = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name("egress-audit".into())
            .spawn(move || write_events(&rt, &store, self.rx))?;
        Ok(())
    }
}

/// The result column of a gateway event.
fn result_of(operation: &str) -> &'static str {
    match operation {
        "egress.deny" => "denied",
        "credential.exfiltration" => "exfiltration",
        _ => "ok",
    }
}

/// The audit event of a gateway event of `sandbox`, owned by `tenant` (here and on a node
/// of a cluster alike).
pub fn egress_audit_event(
    tenant: Option<TenantName>,
    sandbox: &str,
    operation: &str,
    host: &str,
    port: u16,
    detail: &str,
) -> NewAuditEvent {
    NewAuditEvent {
        tenant,
        key_id: None,
        sandbox: Some(sandbox.to_owned()),
        operation: operation.to_owned(),
        result: result_of(operation).to_owned(),
        detail: Some(if detail.is_empty() {
            format!("{host}:{port}")
        } else {
            detail.to_owned()
        }),
    }
}

fn write_events(rt: &tokio::runtime::Handle, store: &Store, rx: Receiver<EgressEvent>) {
    while let Ok(e) = rx.recv() {
        let tenant = rt
            .block_on(store.sandbox_tenant(e.sandbox.as_str()))
            .ok()
            .flatten();
        let event = egress_audit_event(
            tenant,
            e.sandbox.as_str(),
            e.operation,
            &e.host,
            e.port,
            &e.detail,
        );
        if let Err(err) = rt.block_on(store.record(event)) {
            tracing::error!(error = %err, operation = e.operation, "recording an egress event");
        }
    }
}

impl EgressAudit for AuditSink {
    fn record(&self, event: EgressEvent) {
        match self.tx.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(e)) | Err(TrySendError::Disconnected(e)) => {
                let n = self.metrics.egress_audit_dropped();
                // Log the first drop and then every 1000th, so a flood does not flood the log.
                if self
                    .dropped_logged
                    .fetch_add(1, Ordering::Relaxed)
                    .is_multiple_of(1000)
                {
                    tracing::warn!(
                        sandbox = %e.sandbox,
                        operation = e.operation,
                        dropped = n,
                        "the egress audit queue is full; dropping events"
                    );
                }
            }
        }
    }
}
