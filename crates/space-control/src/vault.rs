//! The credentials vault: per-tenant secrets sealed with AES-256-GCM under the vault key.
//!
//! The key is `SPACE_VAULT_KEY` (64 hex digits) or, when that is unset, the file
//! `<data>/state/vault.key` (64 hex digits, mode 0600), made on the first start. It is not
//! the node's key and never leaves the control plane. Each value is sealed with a fresh
//! random 96-bit nonce and the tenant and name as associated data, so a row copied to another
//! tenant or name does not open. The database also keeps a sealed check value: opening the
//! vault with another key fails at once with a message that says so, and a value that does
//! not open is an error, never garbage.
//!
//! No method returns a value except [`Vault::value`], which the gateway's
//! [`space_node_api::policy::SecretSource`] uses per request.

use std::fmt;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
use rand::rngs::OsRng;
use rand::RngCore;

use space_node_api::secrets::{SecretKind, SecretValue, StoredSecret};

use crate::store::{SecretInfo, SecretRow, Store, StoreError, TenantName};

/// The environment variable that holds the vault key.
pub const VAULT_KEY_ENV: &str = "SPACE_VAULT_KEY";
/// The key file under the state directory, used when [`VAULT_KEY_ENV`] is unset.
pub const VAULT_KEY_FILE: &str = "vault.key";
/// The largest secret value, in bytes.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;
/// The longest secret name, in characters.
pub const MAX_SECRET_NAME: usize = 64;
/// The most host patterns one secret may be bound to.
pub const MAX_SECRET_HOSTS: usize = 64;
/// The most secrets one tenant may keep.
pub const MAX_SECRETS_PER_TENANT: usize = 1000;

const NONCE_LEN: usize = 12;
const CHECK_KEY: &str = "vault.check";
const CHECK_PLAINTEXT: &[u8] = b"space vault key check v1";

/// A 256-bit vault key; its `Debug` form shows nothing of it.
#[derive(Clone)]
pub struct VaultKey([u8; 32]);

impl fmt::Debug for VaultKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("VaultKey(..)")
    }
}

impl Drop for VaultKey {
    fn drop(&mut self) {
        // Best effort: leave no copy of the key in memory that is freed.
        self.0.fill(0);
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// Where the vault key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// The `SPACE_VAULT_KEY` variable.
    Env,
    /// The key file, which existed.
    File,
    /// The key file, made now.
    NewFile,
}

impl VaultKey {
    /// Parses 64 hex digits (surrounding whitespace is ignored).
    pub fn from_hex(text: &str) -> Result<VaultKey, StoreError> {
        let text = text.trim();
        let mut key = [0u8; 32];
        if text.len() != 64 || hex::decode_to_slice(text, &mut key).is_err() {
            return Err(StoreError::Vault(
                "a vault key is 64 hex digits (256 bits)".into(),
            ));
        }
        Ok(VaultKey(key))
    }

    /// A fresh random key.
    pub fn generate() -> VaultKey {
        let mut key = [0u8; 32];
        OsRng.fill_bytes(&mut key);
        VaultKey(key)
    }

    /// The key from `SPACE_VAULT_KEY` when set, else from `<state_dir>/vault.key`, made
    /// (mode 0600) when missing.
    pub fn load(state_dir: &Path) -> Result<(VaultKey, KeySource), StoreError> {
        if let Some(v) = std::env::var_os(VAULT_KEY_ENV).filter(|v| !v.is_empty()) {
            let text = v.to_str().unwrap_or("");
            let key = Self::from_hex(text).map_err(|_| {
                StoreError::Vault(format!("{VAULT_KEY_ENV} must be 64 hex digits (256 bits)"))
            })?;
            return Ok((key, KeySource::Env));
        }
        let path = state_dir.join(VAULT_KEY_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let key = Self::from_hex(&text).map_err(|_| {
                    StoreError::Vault(format!(
                        "{} must hold 64 hex digits (256 bits)",
                        path.display()
                    ))
                })?;
                Ok((key, KeySource::File))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(state_dir)?;
                let key = Self::generate();
                // create_new: two starts racing cannot both write a key.
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)?;
                f.write_all(format!("{}\n", hex::encode(key.0)).as_bytes())?;
                f.sync_all()?;
                Ok((key, KeySource::NewFile))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Whether `name` is a well-formed secret name: `[A-Z_][A-Z0-9_]{0,63}`.
pub fn is_secret_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_SECRET_NAME
        && (b[0].is_ascii_uppercase() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
}

/// Checks a secret name, with a message that shows the rule.
pub fn validate_secret_name(name: &str) -> Result<(), StoreError> {
    if is_secret_name(name) {
        Ok(())
    } else {
        let shown: String = name.chars().take(80).collect();
        Err(StoreError::Invalid(format!(
            "secret name {shown:?} must match [A-Z_][A-Z0-9_]{{0,63}}"
        )))
    }
}

/// The vault over the state store.
pub struct Vault {
    store: Arc<Store>,
    cipher: Aes256Gcm,
    /// The key of [`Vault::mac`], derived from the vault key.
    mac_key: [u8; 32],
}

impl fmt::Debug for Vault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vault").finish_non_exhaustive()
    }
}

/// What a value is sealed with besides the key: tenant and name, and for any kind but a
/// plain value the kind too, so a row whose kind was changed does not open.
fn aad(tenant: &TenantName, name: &str, kind: SecretKind) -> Vec<u8> {
    let mut a = Vec::with_capacity(tenant.as_str().len() + name.len() + 8);
    a.extend_from_slice(tenant.as_str().as_bytes());
    a.push(0);
    a.extend_from_slice(name.as_bytes());
    if kind != SecretKind::Value {
        a.push(0);
        a.extend_from_slice(kind.as_str().as_bytes());
    }
    a
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Vault {
    /// Opens the vault with `key`. The first open of a database records a sealed check
    /// value; later opens with another key fail with a message that says so.
    pub async fn open(store: Arc<Store>, key: &VaultKey) -> Result<Vault, StoreError> {
        let mac_key: [u8; 32] = {
            use sha2::Digest;
            let mut h = sha2::Sha256::new();
            h.update(b"space vault mac key\0");
            h.update(key.0);
            h.finalize().into()
        };
        let vault = Vault {
            store,
            cipher: Aes256Gcm::new(&key.0.into()),
            mac_key,
        };
        let (nonce, ct) = vault.seal(b"check", CHECK_PLAINTEXT)?;
        let mut fresh = nonce;
        fresh.extend_from_slice(&ct);
        let stored = vault.store.meta_init(CHECK_KEY, &fresh).await?;
        let ok = stored.len() > NONCE_LEN
            && vault
                .unseal(b"check", &stored[..NONCE_LEN], &stored[NONCE_LEN..])
                .is_ok_and(|p| p == CHECK_PLAINTEXT);
        if !ok {
            return Err(StoreError::Vault(format!(
                "the vault key is not the one this state database's secrets were sealed with; \
                 set {VAULT_KEY_ENV} (or restore state/{VAULT_KEY_FILE}) to the original key"
            )));
        }
        Ok(vault)
    }

    fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Result<(Vec<u8>, Vec<u8>), StoreError> {
        let mut nonce = [0u8; NONCE_LEN];
        OsRng.fill_bytes(&mut nonce);
        let ct = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .map_err(|_| StoreError::Vault("sealing a value failed".into()))?;
        Ok((nonce.to_vec(), ct))
    }

    fn unseal(&self, aad: &[u8], nonce: &[u8], ct: &[u8]) -> Result<Vec<u8>, aes_gcm::Error> {
        if nonce.len() != NONCE_LEN {
            return Err(aes_gcm::Error);
        }
        self.cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad })
    }

    /// Seals `plaintext` under the vault key, bound to `purpose` (nonce followed by the
    /// ciphertext): the deployment's own secrets kept in the database (the cluster CA key).
    pub fn seal_blob(&self, purpose: &str, plaintext: &[u8]) -> Result<Vec<u8>, StoreError> {
        let (mut nonce, ct) = self.seal(purpose.as_bytes(), plaintext)?;
        nonce.extend_from_slice(&ct);
        Ok(nonce)
    }

    /// HMAC-SHA256 of `data` for `purpose` under a key derived from the vault key: the same
    /// on every replica of a deployment, and unguessable without the vault key (tokens the
    /// deployment hands out and checks without storing them).
    pub fn mac(&self, purpose: &str, data: &[u8]) -> [u8; 32] {
        use hmac::{Hmac, Mac};
        let mut m = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.mac_key)
            .expect("HMAC takes a key of any length");
        m.update(purpose.as_bytes());
        m.update(&[0]);
        m.update(data);
        m.finalize().into_bytes().into()
    }

    /// Opens what [`Vault::seal_blob`] sealed for `purpose`.
    pub fn open_blob(&self, purpose: &str, blob: &[u8]) -> Result<Vec<u8>, StoreError> {
        if blob.len() <= NONCE_LEN {
            return Err(StoreError::Vault(format!(
                "the sealed {purpose} is truncated"
            )));
        }
        self.unseal(purpose.as_bytes(), &blob[..NONCE_LEN], &blob[NONCE_LEN..])
            .map_err(|_| {
                StoreError::Vault(format!(
                    "the sealed {purpose} does not open: the vault key is not the one it was \
                     sealed with"
                ))
            })
    }

    /// Checks and seals `value` of `kind` (for a TOTP secret, its seed in base32 or an
    /// `otpauth://totp` URI) as secret `name` of `tenant`, bound to `hosts` (rule strings the
    /// caller has validated): the row to store, made at `created` (now when `None`).
    pub fn seal_row(
        &self,
        tenant: &TenantName,
        name: &str,
        kind: SecretKind,
        value: &[u8],
        hosts: Vec<String>,
        created: Option<u64>,
    ) -> Result<SecretRow, StoreError> {
        validate_secret_name(name)?;
        let canonical;
        let value = match kind {
            SecretKind::Value => value,
            SecretKind::Totp => {
                let text = std::str::from_utf8(value)
                    .map_err(|_| StoreError::Invalid("a TOTP seed is base32 text".into()))?;
                let totp = space_node_api::totp::Totp::parse(text).map_err(StoreError::Invalid)?;
                canonical = SecretValue::new(totp.to_text().into_bytes());
                canonical.as_bytes()
            }
        };
        if value.is_empty() {
            return Err(StoreError::Invalid(
                "a secret value must not be empty".into(),
            ));
        }
        if value.len() > MAX_SECRET_BYTES {
            return Err(StoreError::Invalid(format!(
                "a secret value is at most {MAX_SECRET_BYTES} bytes (this one is {})",
                value.len()
            )));
        }
        if hosts.is_empty() {
            return Err(StoreError::Invalid(
                "a secret needs at least one host pattern it may be sent to".into(),
            ));
        }
        if hosts.len() > MAX_SECRET_HOSTS {
            return Err(StoreError::Invalid(format!(
                "a secret is bound to at most {MAX_SECRET_HOSTS} host patterns"
            )));
        }
        let (nonce, ciphertext) = self.seal(&aad(tenant, name, kind), value)?;
        let now = now_ms();
        Ok(SecretRow {
            tenant: tenant.clone(),
            name: name.to_owned(),
            hosts,
            nonce,
            ciphertext,
            created_unix_ms: created.unwrap_or(now),
            updated_unix_ms: now,
            kind,
        })
    }

    /// Sets (or replaces) secret `name` of `tenant` to `value` of `kind`, bound to `hosts`
    /// ([`Vault::seal_row`]); returns the listing and whether it is new.
    pub async fn put(
        &self,
        tenant: &TenantName,
        name: &str,
        kind: SecretKind,
        value: &[u8],
        hosts: Vec<String>,
    ) -> Result<(SecretInfo, bool), StoreError> {
        validate_secret_name(name)?;
        let existing = self.store.secret(tenant, name).await?;
        let row = self.seal_row(
            tenant,
            name,
            kind,
            value,
            hosts,
            existing.as_ref().map(|e| e.created_unix_ms),
        )?;
        if existing.is_none() && self.store.secrets(tenant).await?.len() >= MAX_SECRETS_PER_TENANT {
            return Err(StoreError::Invalid(format!(
                "a tenant keeps at most {MAX_SECRETS_PER_TENANT} secrets"
            )));
        }
        let created = self.store.put_secret(&row).await?;
        Ok((SecretInfo::from(&row), created))
    }

    /// The secrets of `tenant`, without values.
    pub async fn list(&self, tenant: &TenantName) -> Result<Vec<SecretInfo>, StoreError> {
        self.store.secrets(tenant).await
    }

    /// The listing of secret `name` of `tenant`, if it exists.
    pub async fn info(
        &self,
        tenant: &TenantName,
        name: &str,
    ) -> Result<Option<SecretInfo>, StoreError> {
        validate_secret_name(name)?;
        Ok(self
            .store
            .secret(tenant, name)
            .await?
            .as_ref()
            .map(SecretInfo::from))
    }

    /// Deletes secret `name` of `tenant`; returns whether it existed.
    pub async fn delete(&self, tenant: &TenantName, name: &str) -> Result<bool, StoreError> {
        validate_secret_name(name)?;
        self.store.delete_secret(tenant, name).await
    }

    /// The value of secret `name` of `tenant`, if it exists; an error (never other bytes)
    /// when it does not open under this key.
    pub async fn value(
        &self,
        tenant: &TenantName,
        name: &str,
    ) -> Result<Option<StoredSecret>, StoreError> {
        validate_secret_name(name)?;
        let Some(row) = self.store.secret(tenant, name).await? else {
            return Ok(None);
        };
        self.unseal(&aad(tenant, name, row.kind), &row.nonce, &row.ciphertext)
            .map(|held| {
                Some(StoredSecret {
                    kind: row.kind,
                    held: SecretValue::new(held),
                })
            })
            .map_err(|_| {
                StoreError::Vault(format!(
                    "secret {name} of tenant {tenant} does not decrypt: the vault key is not \
                     the one it was sealed with, or the row is damaged"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Quotas;

    fn t(name: &str) -> TenantName {
        name.parse().unwrap()
    }

    async fn store_with(tenants: &[&str]) -> Arc<Store> {
        let s = Store::open_in_memory().unwrap();
        for n in tenants {
            s.create_tenant(&t(n), Quotas::default()).await.unwrap();
        }
        Arc::new(s)
    }

    #[test]
    fn names_follow_the_rule() {
        for ok in ["A", "_", "GITHUB_TOKEN", "X9", &"A".repeat(64)] {
            assert!(is_secret_name(ok), "{ok}");
        }
        for bad in [
            "",
            "a",
            "9A",
            "GITHUB-TOKEN",
            "TOKEN ",
            "É",
            &"A".repeat(65),
        ] {
            assert!(!is_secret_name(bad), "{bad:?}");
            assert!(validate_secret_name(bad).is_err());
        }
    }

    #[tokio::test]
    async fn values_round_trip_and_never_rest_in_clear() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.db");
        let store = Arc::new(Store::open(&path).unwrap());
        store
            .create_tenant(&t("acme"), Quotas::default())
            .await
            .unwrap();
        let key = VaultKey::generate();
        let vault = Vault::open(store.clone(), &key).await.unwrap();
        let value = b"ghp_very-secret-value-0123456789";
        let (info, created) = vault
            .put(
                &t("acme"),
                "GITHUB_TOKEN",
                SecretKind::Value,
                value,
                vec!["api.github.com".into()],
            )
            .await
            .unwrap();
        assert!(created);
        assert_eq!(info.hosts, ["api.github.com"]);
        assert_eq!(
            vault
                .value(&t("acme"), "GITHUB_TOKEN")
                .await
                .unwrap()
                .map(|s| s.held.as_bytes().to_vec())
                .as_deref(),
            Some(&value[..])
        );
        // Replacing keeps the creation time and reports 'not new'.
        std::thread::sleep(std::time::Duration::from_millis(3));
        let (again, created) = vault
            .put(
                &t("acme"),
                "GITHUB_TOKEN",
                SecretKind::Value,
                b"v2",
                vec!["*.github.com".into()],
            )
            .await
            .unwrap();
        assert!(!created);
        assert_eq!(again.created_unix_ms, info.created_unix_ms);
        assert!(again.updated_unix_ms > info.updated_unix_ms);
        assert_eq!(
            vault
                .value(&t("acme"), "GITHUB_TOKEN")
                .await
                .unwrap()
                .map(|s| s.held.as_bytes().to_vec())
                .as_deref(),
            Some(&b"v2"[..])
        );
        vault
            .put(
                &t("acme"),
                "OTHER",
                SecretKind::Value,
                value,
                vec!["x.example".into()],
            )
            .await
            .unwrap();
        let names: Vec<String> = vault
            .list(&t("acme"))
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["GITHUB_TOKEN", "OTHER"]);
        drop(vault);
        drop(store);
        let mut bytes = std::fs::read(&path).unwrap();
        if let Ok(wal) = std::fs::read(path.with_extension("db-wal")) {
            bytes.extend(wal);
        }
        assert!(!bytes.windows(value.len()).any(|w| w == value));
    }

    #[tokio::test]
    async fn a_wrong_key_is_a_clear_error() {
        let store = store_with(&["acme"]).await;
        let vault = Vault::open(store.clone(), &VaultKey::generate())
            .await
            .unwrap();
        vault
            .put(
                &t("acme"),
                "TOKEN",
                SecretKind::Value,
                b"value",
                vec!["h.example".into()],
            )
            .await
            .unwrap();
        let e = Vault::open(store.clone(), &VaultKey::generate())
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Vault(m) if m.contains(VAULT_KEY_ENV)),
            "{e}"
        );
        // A row moved to another name does not open (the name is bound to the ciphertext).
        let mut row = store.secret(&t("acme"), "TOKEN").await.unwrap().unwrap();
        row.name = "MOVED".into();
        store.put_secret(&row).await.unwrap();
        let e = vault.value(&t("acme"), "MOVED").await.unwrap_err();
        assert!(
            matches!(&e, StoreError::Vault(m) if m.contains("does not decrypt")),
            "{e}"
        );
        // A damaged ciphertext too.
        let mut row = store.secret(&t("acme"), "TOKEN").await.unwrap().unwrap();
        row.ciphertext[0] ^= 1;
        store.put_secret(&row).await.unwrap();
        assert!(vault.value(&t("acme"), "TOKEN").await.is_err());
    }

    #[tokio::test]
    async fn tenants_are_isolated_and_input_is_bounded() {
        let store = store_with(&["a", "b"]).await;
        let vault = Vault::open(store, &VaultKey::generate()).await.unwrap();
        vault
            .put(&t("a"), "TOKEN", SecretKind::Value, b"va", vec!["h".into()])
            .await
            .unwrap();
        assert!(vault.value(&t("b"), "TOKEN").await.unwrap().is_none());
        assert!(vault.list(&t("b")).await.unwrap().is_empty());
        assert!(!vault.delete(&t("b"), "TOKEN").await.unwrap());
        assert!(vault.value(&t("a"), "TOKEN").await.unwrap().is_some());
        let big = vec![b'x'; MAX_SECRET_BYTES + 1];
        for (name, value, hosts) in [
            ("TOKEN", &big[..], vec!["h".to_string()]),
            ("TOKEN", &b""[..], vec!["h".to_string()]),
            ("TOKEN", &b"v"[..], vec![]),
            ("bad", &b"v"[..], vec!["h".to_string()]),
        ] {
            assert!(
                matches!(
                    vault
                        .put(&t("a"), name, SecretKind::Value, value, hosts)
                        .await,
                    Err(StoreError::Invalid(_))
                ),
                "{name} {}",
                value.len()
            );
        }
        assert!(vault
            .put(
                &t("a"),
                "MAX",
                SecretKind::Value,
                &big[..MAX_SECRET_BYTES],
                vec!["h".into()]
            )
            .await
            .is_ok());
        assert!(matches!(
            vault
                .put(
                    &t("nobody"),
                    "TOKEN",
                    SecretKind::Value,
                    b"v",
                    vec!["h".into()]
                )
                .await,
            Err(StoreError::NotFound { what: "tenant", .. })
        ));
        assert!(vault.delete(&t("a"), "TOKEN").await.unwrap());
        assert!(vault.value(&t("a"), "TOKEN").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn totp_seeds_are_kept_canonical_and_their_kind_is_sealed() {
        let store = store_with(&["a"]).await;
        let vault = Vault::open(store.clone(), &VaultKey::generate())
            .await
            .unwrap();
        let (info, _) = vault
            .put(
                &t("a"),
                "SITE_OTP",
                SecretKind::Totp,
                b"jbsw y3dp ehpk 3pxp",
                vec!["login.example".into()],
            )
            .await
            .unwrap();
        assert_eq!(info.kind, SecretKind::Totp);
        let stored = vault.value(&t("a"), "SITE_OTP").await.unwrap().unwrap();
        assert_eq!(stored.kind, SecretKind::Totp);
        let text = String::from_utf8(stored.held.as_bytes().to_vec()).unwrap();
        assert!(text.starts_with("otpauth://totp/"), "{text}");
        let code = stored.current().unwrap();
        assert!(code.is_one_time());
        assert_eq!(code.as_bytes().len(), 6);
        // A seed that is not one is refused, with the reason.
        let e = vault
            .put(
                &t("a"),
                "SITE_OTP",
                SecretKind::Totp,
                b"not a seed!",
                vec!["h".into()],
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Invalid(m) if m.contains("base32")),
            "{e}"
        );
        // Flipping the kind in the database makes the row not open.
        let mut row = store.secret(&t("a"), "SITE_OTP").await.unwrap().unwrap();
        row.kind = SecretKind::Value;
        store.put_secret(&row).await.unwrap();
        assert!(vault.value(&t("a"), "SITE_OTP").await.is_err());
    }

    #[test]
    fn the_key_file_is_made_once_with_mode_0600() {
        // The variable would take precedence; this test does not set it.
        if std::env::var_os(VAULT_KEY_ENV).is_some() {
            return;
        }
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (k1, s1) = VaultKey::load(dir.path()).unwrap();
        assert_eq!(s1, KeySource::NewFile);
        let meta = std::fs::metadata(dir.path().join(VAULT_KEY_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let (k2, s2) = VaultKey::load(dir.path()).unwrap();
        assert_eq!(s2, KeySource::File);
        assert_eq!(k1.0, k2.0);
        assert_eq!(format!("{k1:?}"), "VaultKey(..)");
        std::fs::write(dir.path().join(VAULT_KEY_FILE), "not hex").unwrap();
        assert!(VaultKey::load(dir.path()).is_err());
        assert!(VaultKey::from_hex(&"ab".repeat(32)).is_ok());
        assert!(VaultKey::from_hex(&"ab".repeat(31)).is_err());
        assert!(VaultKey::from_hex(&"zz".repeat(32)).is_err());
    }
}
