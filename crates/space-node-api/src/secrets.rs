//! Credentials as a sandbox holds them (a binding: name, placeholder, hosts; never a value),
//! and what a node's gateway asks of whoever keeps the values and the audit log: a
//! [`SecretSource`] and an [`EgressAudit`].

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use crate::ids::SandboxId;
use crate::policy::EgressRule;

/// The most credentials a sandbox may have bound.
pub const MAX_BINDINGS: usize = 64;

/// A credential bound to a sandbox: the guest sees `placeholder` in the environment variable
/// `name`; the gateway puts the real value in its place on requests to `hosts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretBinding {
    /// The vault name, also the environment variable (`[A-Z_][A-Z0-9_]{0,63}`).
    pub name: String,
    /// `space-secret-<32 hex digits>`.
    pub placeholder: String,
    /// Where the value may go (rule syntax).
    pub hosts: Vec<EgressRule>,
}

impl SecretBinding {
    /// A binding for `name` with a fresh random placeholder.
    pub fn new(name: impl Into<String>, hosts: Vec<EgressRule>) -> SecretBinding {
        use rand::RngCore;
        let mut raw = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        SecretBinding {
            name: name.into(),
            placeholder: format!("space-secret-{hex}"),
            hosts,
        }
    }

    /// Checks the name, the placeholder and the number of host rules.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.name.as_bytes();
        let name_ok = !n.is_empty()
            && n.len() <= 64
            && (n[0].is_ascii_uppercase() || n[0] == b'_')
            && n.iter()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_');
        if !name_ok {
            return Err(format!(
                "credential name {:?} must match [A-Z_][A-Z0-9_]{{0,63}}",
                self.name.chars().take(80).collect::<String>()
            ));
        }
        let hex = self.placeholder.strip_prefix("space-secret-");
        if !hex.is_some_and(|h| {
            h.len() == 32
                && h.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        }) {
            return Err(format!(
                "credential {}: the placeholder must be space-secret-<32 lowercase hex digits>",
                self.name
            ));
        }
        if self.hosts.len() > crate::policy::MAX_RULES {
            return Err(format!(
                "credential {}: at most {} host rules",
                self.name,
                crate::policy::MAX_RULES
            ));
        }
        Ok(())
    }
}

/// Checks a sandbox's bindings together: each valid, names and placeholders unique.
pub fn validate_bindings(bindings: &[SecretBinding]) -> Result<(), String> {
    if bindings.len() > MAX_BINDINGS {
        return Err(format!(
            "{} credentials bound; at most {MAX_BINDINGS}",
            bindings.len()
        ));
    }
    for (i, b) in bindings.iter().enumerate() {
        b.validate()?;
        if bindings[..i]
            .iter()
            .any(|o| o.name == b.name || o.placeholder == b.placeholder)
        {
            return Err(format!("credential {} is bound twice", b.name));
        }
    }
    Ok(())
}

/// A secret's value. Its `Debug` shows nothing, and its buffer is overwritten with zeros when
/// it is dropped.
pub struct SecretValue(Vec<u8>);

impl SecretValue {
    /// Wraps `bytes`.
    pub fn new(bytes: Vec<u8>) -> SecretValue {
        SecretValue(bytes)
    }

    /// The value.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Overwrites `buf` with zeros in a way the compiler does not remove.
    pub fn wipe(buf: &mut [u8]) {
        for b in buf.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference to a byte of `buf`.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
}

impl From<Vec<u8>> for SecretValue {
    fn from(v: Vec<u8>) -> Self {
        SecretValue(v)
    }
}

impl From<String> for SecretValue {
    fn from(v: String) -> Self {
        SecretValue(v.into_bytes())
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Drop for SecretValue {
    fn drop(&mut self) {
        let len = self.0.len();
        // Zero the spare capacity too: earlier contents may have been moved there.
        self.0.resize(self.0.capacity(), 0);
        SecretValue::wipe(&mut self.0);
        self.0.truncate(len);
    }
}

/// Where the gateway gets secret values: the control plane's vault.
pub trait SecretSource: Send + Sync + 'static {
    /// The current value of secret `name` for sandbox `sandbox` (the control plane resolves
    /// the tenant); `None` when it is gone.
    fn value<'a>(
        &'a self,
        sandbox: &'a SandboxId,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<SecretValue>> + Send + 'a>>;
}

/// One egress decision or credential use, for the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressEvent {
    /// Whose.
    pub sandbox: SandboxId,
    /// `egress.allow`, `egress.deny`, `credential.use` or `credential.exfiltration`.
    pub operation: &'static str,
    /// The destination host as the guest named it.
    pub host: String,
    /// The destination port.
    pub port: u16,
    /// The rest, as documented per operation in `docs/egress.md` (never a secret's value).
    pub detail: String,
}

/// An [`EgressEvent`] as it crosses from a node of a cluster to the control plane, with the
/// time it happened (it may reach the audit log later).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressRecord {
    /// When the gateway decided, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// Whose.
    pub sandbox: SandboxId,
    /// As in [`EgressEvent::operation`].
    pub operation: String,
    /// As in [`EgressEvent::host`].
    pub host: String,
    /// As in [`EgressEvent::port`].
    pub port: u16,
    /// As in [`EgressEvent::detail`].
    pub detail: String,
}

impl EgressRecord {
    /// `e`, happening at `at_unix_ms`.
    pub fn new(e: EgressEvent, at_unix_ms: u64) -> EgressRecord {
        EgressRecord {
            at_unix_ms,
            sandbox: e.sandbox,
            operation: e.operation.to_owned(),
            host: e.host,
            port: e.port,
            detail: e.detail,
        }
    }
}

/// The operations an egress event may name.
pub const EGRESS_OPERATIONS: &[&str] = &[
    "egress.allow",
    "egress.deny",
    "credential.use",
    "credential.exfiltration",
];

/// Where egress events go. `record` must not block (the control plane queues).
pub trait EgressAudit: Send + Sync + 'static {
    /// Takes one event.
    fn record(&self, event: EgressEvent);
}
