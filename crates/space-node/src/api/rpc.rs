//! The node API over the network: one call per request, as JSON.
//!
//! `POST /node/v1/call` carries a [`Call`]; a `200` answer is the call's result, any other
//! status carries `{"fault": Fault}`. Guest traffic does not pass through here: requests
//! under `/node/v1/sandboxes/{id}/guest/` are the guest protocol itself, served by the node
//! for that sandbox (`serve`).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Fault, FaultCode, NodeApi, NodeResult, TemplateBuild};
use crate::gateway::EgressPolicy;
use crate::ids::{SandboxId, SnapshotId, TemplateName, TemplateRef, VersionReq};
use crate::record::{SnapshotKind, TimeoutPolicy};
use crate::sandbox::CreateRequest;

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

/// One call of [`NodeApi`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Call {
    Status,
    Create {
        req: Box<CreateRequest>,
    },
    Fork {
        id: SandboxId,
    },
    Info {
        id: SandboxId,
    },
    List,
    Usage,
    Pause {
        id: SandboxId,
    },
    Resume {
        id: SandboxId,
    },
    Suspend {
        id: SandboxId,
    },
    Restore {
        id: SandboxId,
    },
    Kill {
        id: SandboxId,
    },
    Touch {
        id: SandboxId,
    },
    Snapshot {
        id: SandboxId,
        kind: SnapshotKind,
    },
    Rollback {
        id: SandboxId,
        snapshot: SnapshotId,
    },
    SetTimeouts {
        id: SandboxId,
        timeouts: TimeoutPolicy,
    },
    SetEgress {
        id: SandboxId,
        policy: EgressPolicy,
    },
    ConsoleTail {
        id: SandboxId,
        max_bytes: usize,
    },
    /// Wakes the sandbox if it sleeps (the first half of [`NodeApi::guest`]).
    Wake {
        id: SandboxId,
    },
    Templates,
    Template {
        name: TemplateName,
        version: VersionReq,
    },
    Images,
    BuildTemplate {
        build: Box<TemplateBuild>,
    },
    DeleteTemplate {
        template: TemplateRef,
    },
    BuildLog {
        build: String,
        from: u64,
    },
    SaveTemplate {
        id: SandboxId,
        template: TemplateRef,
    },
    Pools,
    CaPem,
    Configure {
        settings: Box<crate::settings::NodeSettings>,
    },
    Adopt {
        id: SandboxId,
        tenant: String,
        epoch: u64,
    },
    Discard {
        id: SandboxId,
    },
    PublishTemplate {
        template: TemplateRef,
    },
    FetchTemplate {
        template: TemplateRef,
    },
    SetSecrets {
        id: SandboxId,
        values: crate::settings::SecretMap,
    },
    ForgetSecret {
        name: String,
    },
}

impl Call {
    /// Its name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Status => "status",
            Call::Create { .. } => "create",
            Call::Fork { .. } => "fork",
            Call::Info { .. } => "info",
            Call::List => "list",
            Call::Usage => "usage",
            Call::Pause { .. } => "pause",
            Call::Resume { .. } => "resume",
            Call::Suspend { .. } => "suspend",
            Call::Restore { .. } => "restore",
            Call::Kill { .. } => "kill",
            Call::Touch { .. } => "touch",
            Call::Snapshot { .. } => "snapshot",
            Call::Rollback { .. } => "rollback",
            Call::SetTimeouts { .. } => "set_timeouts",
            Call::SetEgress { .. } => "set_egress",
            Call::ConsoleTail { .. } => "console_tail",
            Call::Wake { .. } => "wake",
            Call::Templates => "templates",
            Call::Template { .. } => "template",
            Call::Images => "images",
            Call::BuildTemplate { .. } => "build_template",
            Call::DeleteTemplate { .. } => "delete_template",
            Call::BuildLog { .. } => "build_log",
            Call::SaveTemplate { .. } => "save_template",
            Call::Pools => "pools",
            Call::CaPem => "ca_pem",
            Call::Configure { .. } => "configure",
            Call::Adopt { .. } => "adopt",
            Call::Discard { .. } => "discard",
            Call::PublishTemplate { .. } => "publish_template",
            Call::FetchTemplate { .. } => "fetch_template",
            Call::SetSecrets { .. } => "set_secrets",
            Call::ForgetSecret { .. } => "forget_secret",
        }
    }
}

/// The answer body of a refused or failed call.
#[derive(Debug, Serialize, Deserialize)]
pub struct FaultBody {
    /// What went wrong.
    pub fault: Fault,
}

/// Console bytes as they cross: base64.
pub fn encode_bytes(b: &[u8]) -> String {
    B64.encode(b)
}

/// The inverse of [`encode_bytes`].
pub fn decode_bytes(s: &str) -> NodeResult<Vec<u8>> {
    B64.decode(s)
        .map_err(|e| Fault::new(FaultCode::Internal, format!("console bytes: {e}")))
}

fn json<T: Serialize>(v: T) -> NodeResult<Value> {
    serde_json::to_value(v).map_err(|e| Fault::new(FaultCode::Internal, e.to_string()))
}

/// Runs `call` on `api` and gives its result as JSON.
pub async fn dispatch(api: &dyn NodeApi, call: Call) -> NodeResult<Value> {
    match call {
        Call::Status => json(api.status().await?),
        Call::Create { req } => json(api.create(*req).await?),
        Call::Fork { id } => json(api.fork(&id).await?),
        Call::Info { id } => json(api.info(&id).await?),
        Call::List => json(api.list().await?),
        Call::Usage => json(api.usage().await?),
        Call::Pause { id } => json(api.pause(&id).await?),
        Call::Resume { id } => json(api.resume(&id).await?),
        Call::Suspend { id } => json(api.suspend(&id).await?),
        Call::Restore { id } => json(api.restore(&id).await?),
        Call::Kill { id } => json(api.kill(&id).await?),
        Call::Touch { id } => json(api.touch(&id).await?),
        Call::Snapshot { id, kind } => json(api.snapshot(&id, kind).await?),
        Call::Rollback { id, snapshot } => json(api.rollback(&id, &snapshot).await?),
        Call::SetTimeouts { id, timeouts } => json(api.set_timeouts(&id, timeouts).await?),
        Call::SetEgress { id, policy } => json(api.set_egress(&id, policy).await?),
        Call::ConsoleTail { id, max_bytes } => {
            json(encode_bytes(&api.console_tail(&id, max_bytes).await?))
        }
        Call::Wake { id } => json(api.guest(&id).await?.1),
        Call::Templates => json(api.templates().await?),
        Call::Template { name, version } => json(api.template(&name, &version).await?),
        Call::Images => json(api.images().await?),
        Call::BuildTemplate { build } => json(api.build_template(*build).await?),
        Call::DeleteTemplate { template } => json(api.delete_template(&template).await?),
        Call::BuildLog { build, from } => json(api.build_log(&build, from).await?),
        Call::SaveTemplate { id, template } => json(api.save_template(&id, &template).await?),
        Call::Pools => json(api.pools().await?),
        Call::CaPem => json(api.ca_pem().await?),
        Call::Configure { settings } => json(api.configure(*settings).await?),
        Call::Adopt { id, tenant, epoch } => json(api.adopt(&id, &tenant, epoch).await?),
        Call::Discard { id } => json(api.discard(&id).await?),
        Call::PublishTemplate { template } => json(api.publish_template(&template).await?),
        Call::FetchTemplate { template } => json(api.fetch_template(&template).await?),
        Call::SetSecrets { id, values } => json(api.set_secrets(&id, values).await?),
        Call::ForgetSecret { name } => json(api.forget_secret(&name).await?),
    }
}

/// The HTTP status a fault is answered with.
pub fn status_of(f: &Fault) -> u16 {
    match f.code {
        FaultCode::NotFound | FaultCode::SnapshotNotFound | FaultCode::TemplateNotFound => 404,
        FaultCode::IllegalState
        | FaultCode::TemplateExists
        | FaultCode::TemplateInUse
        | FaultCode::TemplateStale => 409,
        FaultCode::InvalidId | FaultCode::Invalid => 400,
        FaultCode::Key => 403,
        FaultCode::ShuttingDown
        | FaultCode::Capacity
        | FaultCode::DiskFull
        | FaultCode::Unavailable => 503,
        FaultCode::Archive | FaultCode::Guest => 502,
        FaultCode::Internal => 500,
    }
}
