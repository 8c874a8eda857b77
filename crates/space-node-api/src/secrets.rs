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
/// it is dropped. A one-time value (a TOTP code) is put in like any other but not looked for
/// in responses: it is short, common as text, and worth nothing once used.
pub struct SecretValue {
    bytes: Vec<u8>,
    one_time: bool,
}

impl SecretValue {
    /// Wraps `bytes`.
    pub fn new(bytes: Vec<u8>) -> SecretValue {
        SecretValue {
            bytes,
            one_time: false,
        }
    }

    /// A one-time code.
    pub fn one_time(code: String) -> SecretValue {
        SecretValue {
            bytes: code.into_bytes(),
            one_time: true,
        }
    }

    /// Whether this is a one-time code.
    pub fn is_one_time(&self) -> bool {
        self.one_time
    }

    /// The value.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
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
        SecretValue::new(v)
    }
}

impl From<String> for SecretValue {
    fn from(v: String) -> Self {
        SecretValue::new(v.into_bytes())
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Drop for SecretValue {
    fn drop(&mut self) {
        let len = self.bytes.len();
        // Zero the spare capacity too: earlier contents may have been moved there.
        self.bytes.resize(self.bytes.capacity(), 0);
        SecretValue::wipe(&mut self.bytes);
        self.bytes.truncate(len);
    }
}

/// What a secret holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretKind {
    /// A value sent as it is.
    #[default]
    Value,
    /// A TOTP seed: the code of the moment is sent ([`crate::totp`]).
    Totp,
}

impl SecretKind {
    /// The kind's name in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            SecretKind::Value => "value",
            SecretKind::Totp => "totp",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<SecretKind> {
        match s {
            "value" => Some(SecretKind::Value),
            "totp" => Some(SecretKind::Totp),
            _ => None,
        }
    }
}

/// A secret as the vault keeps it: its kind and what it holds (the value, or the canonical
/// text of a TOTP generator).
#[derive(Debug)]
pub struct StoredSecret {
    /// Its kind.
    pub kind: SecretKind,
    /// What it holds.
    pub held: SecretValue,
}

impl StoredSecret {
    /// What goes in place of the placeholder at this moment: the value, or the current code;
    /// `None` when a TOTP secret's text does not parse (logged).
    pub fn current(&self) -> Option<SecretValue> {
        match self.kind {
            SecretKind::Value => Some(SecretValue::new(self.held.as_bytes().to_vec())),
            SecretKind::Totp => {
                let text = std::str::from_utf8(self.held.as_bytes()).ok()?;
                match crate::totp::Totp::parse(text) {
                    Ok(t) => Some(SecretValue::one_time(t.now())),
                    Err(e) => {
                        tracing::error!(error = %e, "a stored TOTP seed does not parse");
                        None
                    }
                }
            }
        }
    }

    /// The form a call to a node carries it in: base64, prefixed `totp:` for a TOTP seed
    /// (base64 has no `:`, so a value never looks like one).
    pub fn to_wire(&self) -> String {
        let b64 = crate::calls::encode_bytes(self.held.as_bytes());
        match self.kind {
            SecretKind::Value => b64,
            SecretKind::Totp => format!("totp:{b64}"),
        }
    }

    /// Reads [`StoredSecret::to_wire`]'s form.
    pub fn from_wire(text: &str) -> Option<StoredSecret> {
        let (kind, b64) = match text.strip_prefix("totp:") {
            Some(rest) => (SecretKind::Totp, rest),
            None => (SecretKind::Value, text),
        };
        let held = crate::calls::decode_bytes(b64).ok()?;
        Some(StoredSecret {
            kind,
            held: SecretValue::new(held),
        })
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
