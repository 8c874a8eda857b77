//! Every call of the node API, listed once.
//!
//! The list below is the contract. From it come the [`NodeApi`] trait (no default bodies: an
//! implementation that misses a call does not compile), the [`Call`] enum that carries a call
//! over the network, [`dispatch`] (a call to a method), the [`RemoteNode`](crate::RemoteNode)
//! client, and [`Gated`], a node API in front of another that asks a [`Gate`] before each
//! call. Adding a call is one entry here and its implementations.
//!
//! On the wire, `POST /node/v1/call` carries a [`Call`]; a `200` answer is the call's result
//! as JSON, any other status carries `{"fault": Fault}`. Guest traffic does not pass through
//! here: requests under `/node/v1/sandboxes/{id}/guest/` are the guest protocol itself,
//! served by the node for that sandbox (`serve`), after a [`NodeApi::wake`].
//!
//! An argument written `&name: T` is lent to the trait's method as `&T` and owned by the
//! [`Call`] as `T::Owned` (`&tenant: str` is a `&str` and a `String`); `name: T` is moved.

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use space_proto::GuestClient;

use crate::ids::{SandboxId, SnapshotId, TemplateName, TemplateRef, VersionReq};
use crate::policy::EgressPolicy;
use crate::sandbox::{CreateRequest, SnapshotKind, TimeoutPolicy};
use crate::settings::{NodeSettings, SecretMap};
use crate::template::{LogChunk, TemplateBuild};
use crate::wire::{
    Blob, Fault, FaultCode, NodeStatus, Pool, Sandbox, Snapshot, TemplateInfo, Usage, VolumeAnswer,
    VolumeInfo, Woke,
};
use space_api::MetricSample;
use space_proto::volume::VolumeRequest;

/// What a node API call returns.
pub type NodeResult<T> = Result<T, Fault>;

/// The path of calls.
pub const CALL_PATH: &str = "/node/v1/call";
/// The prefix of a sandbox's guest traffic: `/node/v1/sandboxes/{id}/guest` + guest path.
pub const SANDBOXES_PREFIX: &str = "/node/v1/sandboxes/";
/// What follows the sandbox id in a guest path.
pub const GUEST_SEGMENT: &str = "/guest";
/// The largest call body a node reads.
pub const MAX_CALL_BYTES: usize = 4 << 20;
/// The largest answer a control replica reads.
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

/// The base URI of sandbox `id`'s guest traffic through a node.
pub fn guest_base(id: &SandboxId) -> String {
    format!("https://node{SANDBOXES_PREFIX}{id}{GUEST_SEGMENT}")
}

/// What [`Gated`] asks before each call.
pub trait Gate: Send + Sync + 'static {
    /// `Ok` lets call `call` (its [`Call::name`], or `guest`) through to the inner node API;
    /// a fault answers it instead.
    fn admit(&self, call: &'static str) -> NodeResult<()>;
}

/// A node API in front of another: each call is let through by `gate`, or answered with the
/// gate's fault.
pub struct Gated<A, G> {
    /// The node API behind.
    pub inner: A,
    /// What decides.
    pub gate: G,
}

macro_rules! node_calls {
    ($(
        $(#[$meta:meta])*
        $variant:ident $name:ident(
            $( $(& $lent:ident)? $($moved:ident)? : $ty:ty ),*
        ) -> $ret:ty;
    )*) => {
        /// Everything the control plane asks of a node.
        #[async_trait]
        pub trait NodeApi: Send + Sync + 'static {
            $(
                $(#[$meta])*
                async fn $name(&self, $( $($lent: &$ty)? $($moved: $ty)? ),*) -> NodeResult<$ret>;
            )*

            /// A client of the sandbox's guest, waking the sandbox first when it is paused or
            /// suspended and its `auto_resume` is on; says whether it did. Not a call on the
            /// wire: over the network it is a [`NodeApi::wake`], then the guest protocol
            /// itself on the node's connection.
            async fn guest(&self, id: &SandboxId) -> NodeResult<(GuestClient, Option<Woke>)>;
        }

        /// One call of [`NodeApi`], as it crosses the network.
        #[derive(Debug, Clone, Serialize, Deserialize)]
        #[serde(tag = "call", rename_all = "snake_case")]
        #[allow(clippy::large_enum_variant)]
        pub enum Call {
            $(
                $(#[$meta])*
                $variant {
                    $(
                        #[allow(missing_docs)]
                        $($lent)? $($moved)? : <$ty as ToOwned>::Owned
                    ),*
                },
            )*
        }

        impl Call {
            /// Its name, for logs and metrics (the method's).
            pub fn name(&self) -> &'static str {
                match self {
                    $( Call::$variant { .. } => stringify!($name), )*
                }
            }

            /// Every call's name, in the order of the list.
            pub const NAMES: &'static [&'static str] = &[$( stringify!($name) ),*];
        }

        /// Runs `call` on `api` and gives its result as JSON.
        pub async fn dispatch(api: &dyn NodeApi, call: Call) -> NodeResult<Value> {
            match call {
                $(
                    Call::$variant { $( $($lent)? $($moved)? ),* } => json(
                        api.$name($( $(<_ as std::borrow::Borrow<$ty>>::borrow(&$lent))? $($moved)? ),*)
                            .await?,
                    ),
                )*
            }
        }

        #[async_trait]
        impl NodeApi for crate::remote::RemoteNode {
            $(
                async fn $name(&self, $( $($lent: &$ty)? $($moved: $ty)? ),*) -> NodeResult<$ret> {
                    self.call(Call::$variant {
                        $( $($lent: $lent.to_owned())? $($moved)? ),*
                    })
                    .await
                }
            )*

            async fn guest(&self, id: &SandboxId) -> NodeResult<(GuestClient, Option<Woke>)> {
                let woke = self.wake(id).await?;
                Ok((self.guest_client(id).await?, woke))
            }
        }

        #[async_trait]
        impl<A: NodeApi, G: Gate> NodeApi for Gated<A, G> {
            $(
                async fn $name(&self, $( $($lent: &$ty)? $($moved: $ty)? ),*) -> NodeResult<$ret> {
                    self.gate.admit(stringify!($name))?;
                    self.inner.$name($( $($lent)? $($moved)? ),*).await
                }
            )*

            async fn guest(&self, id: &SandboxId) -> NodeResult<(GuestClient, Option<Woke>)> {
                self.gate.admit("guest")?;
                self.inner.guest(id).await
            }
        }

        #[async_trait]
        impl<T: NodeApi + ?Sized> NodeApi for std::sync::Arc<T> {
            $(
                async fn $name(&self, $( $($lent: &$ty)? $($moved: $ty)? ),*) -> NodeResult<$ret> {
                    (**self).$name($( $($lent)? $($moved)? ),*).await
                }
            )*

            async fn guest(&self, id: &SandboxId) -> NodeResult<(GuestClient, Option<Woke>)> {
                (**self).guest(id).await
            }
        }
    };
}

node_calls! {
    /// The accelerator and QEMU build.
    Status status() -> NodeStatus;

    /// Creates a sandbox. The template is named by its exact build (the caller resolved it
    /// once, with [`NodeApi::template`]).
    Create create(req: CreateRequest) -> Sandbox;
    /// Forks a running sandbox.
    Fork fork(&id: SandboxId) -> Sandbox;
    /// One sandbox.
    Info info(&id: SandboxId) -> Sandbox;
    /// Every sandbox of the node, terminated ones included.
    List list() -> Vec<Sandbox>;
    /// The sandboxes the node holds now and what they use.
    Usage usage() -> Vec<Usage>;

    /// Pauses the vCPUs.
    Pause pause(&id: SandboxId) -> ();
    /// Resumes paused vCPUs.
    Resume resume(&id: SandboxId) -> ();
    /// Takes a full snapshot and stops the VM.
    Suspend suspend(&id: SandboxId) -> Snapshot;
    /// Restores a suspended sandbox.
    Restore restore(&id: SandboxId) -> ();
    /// Stops the VM for good.
    Kill kill(&id: SandboxId) -> ();
    /// Counts as activity for the idle timeout.
    Touch touch(&id: SandboxId) -> ();
    /// Takes a snapshot.
    Snapshot snapshot(&id: SandboxId, kind: SnapshotKind) -> Snapshot;
    /// Rolls back to one of the sandbox's snapshots.
    Rollback rollback(&id: SandboxId, &snapshot: SnapshotId) -> ();
    /// Replaces the timeouts.
    SetTimeouts set_timeouts(&id: SandboxId, timeouts: TimeoutPolicy) -> Sandbox;
    /// Replaces the egress policy.
    SetEgress set_egress(&id: SandboxId, policy: EgressPolicy) -> Sandbox;
    /// The last `max_bytes` of the guest's console.
    ConsoleTail console_tail(&id: SandboxId, max_bytes: usize) -> Blob;
    /// The sandbox's resource samples whose span ends within `[start_ms, end_ms]` (ms since
    /// the epoch), oldest first.
    Metrics metrics(&id: SandboxId, start_ms: u64, end_ms: u64) -> Vec<MetricSample>;
    /// Wakes the sandbox when it is paused or suspended and its `auto_resume` is on, as a
    /// guest request would; says whether it did.
    Wake wake(&id: SandboxId) -> Option<Woke>;

    /// Every complete template build.
    Templates templates() -> Vec<TemplateInfo>;
    /// The build `version` of `name` resolves to.
    Template template(&name: TemplateName, &version: VersionReq) -> TemplateInfo;
    /// The root images templates can be built from.
    Images images() -> Vec<String>;
    /// Builds a template.
    BuildTemplate build_template(build: TemplateBuild) -> TemplateInfo;
    /// Deletes a template build nothing uses.
    DeleteTemplate delete_template(&template: TemplateRef) -> ();
    /// The log of build `build` (a [`TemplateBuild::build_id`]) from byte `from`, waiting a
    /// few seconds for more when there is none yet.
    BuildLog build_log(&build: str, from: u64) -> LogChunk;
    /// Makes a template of a running sandbox: with `memory`, its processes included; without,
    /// its disk booted afresh.
    SaveTemplate save_template(&id: SandboxId, &template: TemplateRef, memory: bool) -> TemplateInfo;
    /// The template pools.
    Pools pools() -> Vec<Pool>;
    /// The PEM of the CA the node's gateway signs intercepted TLS with.
    CaPem ca_pem() -> String;

    /// Gives the node what it gets from the control plane rather than from its disk (object
    /// store, master keys; [`crate::settings`]).
    Configure configure(settings: NodeSettings) -> ();
    /// Takes sandbox `id` of `tenant` from the object store under ownership `epoch`: it is
    /// Suspended here on its newest archived snapshot.
    Adopt adopt(&id: SandboxId, &tenant: str, epoch: u64) -> Sandbox;
    /// Forgets a sandbox (its VM killed, its local state dropped, nothing written to the
    /// store): one that belongs to another node now, or one no tenant owns.
    Discard discard(&id: SandboxId) -> ();
    /// Publishes a template build of this node's to the object store.
    PublishTemplate publish_template(&template: TemplateRef) -> ();
    /// Fetches a published template build from the object store.
    FetchTemplate fetch_template(&template: TemplateRef) -> TemplateInfo;
    /// Gives sandbox `id` the values of the secrets it is bound to, in memory.
    SetSecrets set_secrets(&id: SandboxId, values: SecretMap) -> ();
    /// Makes volume `volume` (an id) of `tenant` of `size_bytes` on this node; an existing
    /// one keeps its content and takes the size.
    CreateVolume create_volume(&volume: str, &tenant: str, size_bytes: u64) -> VolumeInfo;
    /// Brings volume `volume` of `tenant` to this node from its newest copy in the object
    /// store, held under placement `epoch` from now on (the volume moved here); refused when
    /// the store has no copy of it.
    RestoreVolume restore_volume(&volume: str, &tenant: str, size_bytes: u64, epoch: u64) -> VolumeInfo;
    /// Copies the volume to the object store now if it changed since its last copy.
    SyncVolume sync_volume(&volume: str) -> VolumeInfo;
    /// One volume's use, and how far its copy in the object store goes.
    VolumeInfo volume_info(&volume: str) -> VolumeInfo;
    /// Deletes a volume no sandbox of this node mounts.
    DeleteVolume delete_volume(&volume: str) -> ();
    /// One operation on a volume (its file API without a sandbox).
    VolumeCall volume_call(&volume: str, request: VolumeRequest, data: Blob) -> VolumeAnswer;
    /// The volumes of this node, with their use.
    Volumes volumes() -> Vec<VolumeInfo>;
    /// Secret `name` changed in the vault: sandboxes that have its old value forget their
    /// values and ask again. A node that reads the vault itself has nothing to forget.
    ForgetSecret forget_secret(&name: str) -> ();
}

/// The answer body of a refused or failed call.
#[derive(Debug, Serialize, Deserialize)]
pub struct FaultBody {
    /// What went wrong.
    pub fault: Fault,
}

/// Bytes as they cross in JSON: base64.
pub fn encode_bytes(b: &[u8]) -> String {
    B64.encode(b)
}

/// The inverse of [`encode_bytes`].
pub fn decode_bytes(s: &str) -> NodeResult<Vec<u8>> {
    B64.decode(s)
        .map_err(|e| Fault::new(FaultCode::Internal, format!("base64 bytes: {e}")))
}

fn json<T: Serialize>(v: T) -> NodeResult<Value> {
    serde_json::to_value(v).map_err(|e| Fault::new(FaultCode::Internal, e.to_string()))
}

/// The HTTP status a fault is answered with.
pub fn status_of(f: &Fault) -> u16 {
    match f.code {
        FaultCode::NotFound
        | FaultCode::SnapshotNotFound
        | FaultCode::TemplateNotFound
        | FaultCode::VolumeNotFound => 404,
        FaultCode::IllegalState
        | FaultCode::TemplateExists
        | FaultCode::TemplateInUse
        | FaultCode::TemplateStale
        | FaultCode::VolumeInUse => 409,
        FaultCode::InvalidId | FaultCode::Invalid => 400,
        FaultCode::Key => 403,
        FaultCode::ShuttingDown
        | FaultCode::Capacity
        | FaultCode::DiskFull
        | FaultCode::TemplateNotReady
        | FaultCode::Unavailable => 503,
        FaultCode::Archive | FaultCode::Guest => 502,
        FaultCode::Internal => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_has_one_name_and_names_are_unique() {
        let mut names = Call::NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Call::NAMES.len());
        let call: Call =
            serde_json::from_str(r#"{"call":"adopt","id":"sbx-a","tenant":"t","epoch":3}"#)
                .unwrap();
        assert_eq!(call.name(), "adopt");
        let back = serde_json::to_value(&call).unwrap();
        assert_eq!(back["tenant"], "t");
        assert_eq!(back["epoch"], 3);
    }
}
