//! Typed identifiers of the things a node keeps: sandboxes, templates and snapshots.
//!
//! Every id ends up as a path component under the data directory (and in logs), so each type
//! checks its text when parsed or deserialized: 1 to 64 bytes of lowercase ASCII letters,
//! digits, `-`, `_` and `.`, starting with a letter or digit. That excludes `/`, `.`, `..`,
//! NUL and whitespace, and it is stricter than what [`crate::storage::validate_name`] accepts,
//! so every valid id is a valid storage name.

use std::fmt;
use std::str::FromStr;

use rand::RngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest id accepted.
pub const MAX_ID_LEN: usize = 64;

/// A malformed identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {text:?}: {why}")]
pub struct IdError {
    /// Which kind of id.
    pub what: &'static str,
    /// The rejected text (truncated to a sane length).
    pub text: String,
    /// The rule it breaks.
    pub why: &'static str,
}

fn check(what: &'static str, text: &str) -> Result<(), IdError> {
    let err = |why| IdError {
        what,
        text: text.chars().take(80).collect(),
        why,
    };
    if text.is_empty() {
        return Err(err("must not be empty"));
    }
    if text.len() > MAX_ID_LEN {
        return Err(err("longer than 64 bytes"));
    }
    let first = text.as_bytes()[0];
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return Err(err("must start with a lowercase letter or a digit"));
    }
    if !text
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
    {
        return Err(err(
            "only lowercase letters, digits, '-', '_' and '.' are allowed",
        ));
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::validate(s)?;
                Ok(Self(s.to_owned()))
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::validate(&s)?;
                Ok(Self(s))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// A sandbox: `sbx-` and 16 hex digits when the node makes one. It is also the guest's
    /// hostname and the name of its directories.
    SandboxId,
    "sandbox id"
);
string_id!(
    /// A template's name (`minimal`, `base`, `python-3.12`).
    TemplateName,
    "template name"
);
string_id!(
    /// One build of a template. `latest` is reserved: it names whichever build is newest.
    TemplateVersion,
    "template version"
);
string_id!(
    /// A snapshot of one sandbox: `<unix ms, 13 digits>-<kind>-<4 hex>`, so names sort by time
    /// and two snapshots taken in the same millisecond still differ.
    SnapshotId,
    "snapshot id"
);

impl SandboxId {
    /// A fresh random id.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 8];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        SandboxId(format!("sbx-{}", hex(&bytes)))
    }

    fn validate(s: &str) -> Result<(), IdError> {
        check("sandbox id", s)
    }
}

impl TemplateName {
    fn validate(s: &str) -> Result<(), IdError> {
        check("template name", s)
    }
}

/// The reserved version word that resolves to the newest build.
pub const LATEST: &str = "latest";

impl TemplateVersion {
    fn validate(s: &str) -> Result<(), IdError> {
        check("template version", s)?;
        if s == LATEST {
            return Err(IdError {
                what: "template version",
                text: s.to_owned(),
                why: "\"latest\" is reserved for the newest build",
            });
        }
        Ok(())
    }
}

impl SnapshotId {
    /// A fresh id for a snapshot of `kind` taken at `unix_ms`.
    pub fn generate(unix_ms: u64, kind: &str) -> Self {
        let mut bytes = [0u8; 2];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let id = format!("{unix_ms:013}-{kind}-{}", hex(&bytes));
        id.parse().expect("generated snapshot ids are valid")
    }

    fn validate(s: &str) -> Result<(), IdError> {
        check("snapshot id", s)
    }
}

/// A template build: name plus version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TemplateRef {
    /// The template.
    pub name: TemplateName,
    /// The build.
    pub version: TemplateVersion,
}

impl TemplateRef {
    /// Parses both parts.
    pub fn new(name: &str, version: &str) -> Result<Self, IdError> {
        Ok(TemplateRef {
            name: name.parse()?,
            version: version.parse()?,
        })
    }
}

impl fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.version)
    }
}

/// Which build of a template a create asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VersionReq {
    /// The newest complete build.
    Latest,
    /// Exactly this build.
    Exact(TemplateVersion),
}

impl FromStr for VersionReq {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        if s == LATEST {
            Ok(VersionReq::Latest)
        } else {
            Ok(VersionReq::Exact(s.parse()?))
        }
    }
}

impl Serialize for VersionReq {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for VersionReq {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for VersionReq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionReq::Latest => f.write_str(LATEST),
            VersionReq::Exact(v) => v.fmt(f),
        }
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_back() {
        let id = SandboxId::generate();
        assert_eq!(id.as_str().len(), 20);
        assert_eq!(id.as_str().parse::<SandboxId>().unwrap(), id);
        let snap = SnapshotId::generate(1_700_000_000_000, "disk");
        assert!(snap.as_str().starts_with("1700000000000-disk-"));
        assert_eq!(snap.as_str().parse::<SnapshotId>().unwrap(), snap);
        assert_ne!(SandboxId::generate(), SandboxId::generate());
    }

    #[test]
    fn unsafe_path_components_are_refused() {
        for bad in [
            "", ".", "..", "../x", "a/b", "-a", ".hidden", "A", "a b", "a\0b", "é",
        ] {
            assert!(bad.parse::<SandboxId>().is_err(), "{bad:?}");
            assert!(bad.parse::<SnapshotId>().is_err(), "{bad:?}");
        }
        assert!("x".repeat(65).parse::<TemplateName>().is_err());
        assert!("x".repeat(64).parse::<TemplateName>().is_ok());
    }

    #[test]
    fn latest_is_reserved() {
        assert!("latest".parse::<TemplateVersion>().is_err());
        assert_eq!("latest".parse::<VersionReq>().unwrap(), VersionReq::Latest);
        assert_eq!(
            "v2".parse::<VersionReq>().unwrap(),
            VersionReq::Exact("v2".parse().unwrap())
        );
    }

    #[test]
    fn deserializing_checks_the_text() {
        let ok: SandboxId = serde_json::from_str("\"sbx-00\"").unwrap();
        assert_eq!(ok.as_str(), "sbx-00");
        assert!(serde_json::from_str::<SandboxId>("\"../etc\"").is_err());
        let t: TemplateRef = serde_json::from_str(r#"{"name":"minimal","version":"1"}"#).unwrap();
        assert_eq!(t.to_string(), "minimal:1");
    }
}
