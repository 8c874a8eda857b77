//! The object-store format of `space` (`docs/archive.md`): where a sandbox's durable state
//! lives once it leaves its node's disk.
//!
//! A snapshot's files (guest RAM, disk image, device state) are cut into fixed-size chunks.
//! Zero chunks and chunks equal to the base template's at the same offset are not stored;
//! every other chunk is named by a keyed BLAKE3 hash per *lineage* (a sandbox, its snapshots
//! and its forks), stored once per lineage, zstd-compressed, sealed with AES-256-GCM under the
//! lineage's key with its identity as associated data, and packed into objects of tens of MiB.
//! A flat manifest per snapshot lists every file's chunks; nothing refers to an older
//! manifest, so any manifest restores on its own.
//!
//! - [`store`]: the object store (a local directory or S3) and the object paths;
//! - [`crypto`]: keys, chunk identities, sealing;
//! - [`keys`]: the key hierarchy (lineage key, tenant key, master key) and crypto-shredding;
//! - [`kms`]: the AWS KMS API as a master key provider;
//! - [`manifest`], [`pack`]: the two kinds of data object;
//! - [`upload`], [`fetch`]: a snapshot directory into the store and back;
//! - [`lazy`]: a snapshot's files used by a VM before they have arrived;
//! - [`gc`]: garbage collection of unreferenced packs and shredded lineages;
//! - [`uploads`]: build inputs (contexts, image archives) a cluster keeps for its nodes;
//! - [`volumes`]: copies of tenants' volumes.

pub mod crypto;
pub mod fetch;
pub mod gc;
mod http_client;
pub mod keys;
pub mod kms;
pub mod lazy;
pub mod manifest;
pub mod pack;
pub mod store;
pub mod upload;
pub mod uploads;
pub mod volumes;

#[cfg(feature = "testing")]
pub mod testing;

pub use fetch::{materialize, materialize_unsynced, CloneFile, FetchError, FetchReport};
pub use keys::{
    BoxFuture, FileMaster, KeyAudit, KeyError, KeyEvent, Keyring, LocalMaster, MasterDescription,
    MasterKey, MasterResolver,
};
pub use manifest::{BaseRef, HostInfo, Manifest, ManifestError};
pub use store::{Archive, Head, S3Config, StoreConfig, StoreError};
pub use upload::{upload, Known, SourceFile, Unchanged, UploadError, UploadReport, UploadSpec};
pub use volumes::VolumeHead;
