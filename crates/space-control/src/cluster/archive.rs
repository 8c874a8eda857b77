//! The object store of a cluster, as the control plane hands it to nodes: the store and its
//! credentials, the deployment's master key (sealed in the database by the vault key unless
//! a key file is given), which tenants hold KMS keys of their own. A replica keeps its own
//! keyring over the same store for the key routes and for making tenant keys, which it does
//! once per tenant in the whole cluster (under a claim in the database: S3 servers do not
//! all honour conditional writes, so two nodes making one tenant's key at once could each
//! keep their own).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use space_archive::crypto::Key;
use space_archive::{Archive, Keyring, LocalMaster, MasterKey, StoreConfig};
use space_node_api::settings::{KmsKey, NodeSettings, StoreSettings};

use crate::archive::{ArchiveSettings, KeyAuditSink};
use crate::masters::{aws_for_nodes, MasterKeyConfig, TenantMasters};
use crate::store::Store;
use crate::vault::Vault;

/// The `meta` entry of the deployment's master key, sealed by the vault.
const MASTER_META: &str = "cluster_master_key";
/// What its seal is bound to.
const MASTER_PURPOSE: &str = "deployment master key";
/// How long a replica holds the claim to make a tenant's key.
const TENANT_KEY_CLAIM: Duration = Duration::from_secs(30);

/// A cluster's object store.
pub struct ClusterArchive {
    settings: ArchiveSettings,
    master_hex: String,
    keyring: Arc<Keyring>,
    masters: Arc<TenantMasters>,
    /// Tenants whose key this replica saw in the store.
    keyed: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for ClusterArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterArchive")
            .field("store", &self.settings.store.to_string())
            .finish_non_exhaustive()
    }
}

impl ClusterArchive {
    /// Opens the store and the master key: from `settings.master_key_file` when given,
    /// otherwise the one sealed in the database (made by the first replica to start).
    pub async fn open(
        store: Arc<Store>,
        vault: &Vault,
        settings: ArchiveSettings,
        audit: Arc<KeyAuditSink>,
    ) -> anyhow::Result<ClusterArchive> {
        let master_hex = match &settings.master_key_file {
            Some(path) => {
                LocalMaster::open_or_create(path)
                    .with_context(|| format!("the master key file {}", path.display()))?;
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?
                    .trim()
                    .to_owned()
            }
            None => {
                let fresh = hex::encode(Key::random().as_bytes());
                let blob = vault.seal_blob(MASTER_PURPOSE, fresh.as_bytes())?;
                let stored = store.meta_init(MASTER_META, &blob).await?;
                String::from_utf8(vault.open_blob(MASTER_PURPOSE, &stored)?)
                    .context("the sealed master key")?
            }
        };
        let key = Key::from_slice(&hex::decode(&master_hex).context("the master key")?)
            .map_err(|e| anyhow::anyhow!("the master key: {e}"))?;
        let deployment: Arc<dyn MasterKey> = Arc::new(LocalMaster::from_key(key));
        let masters = Arc::new(TenantMasters::new(deployment));
        masters.connect(store.clone());
        let archive = Archive::new(&settings.store).context("the object store")?;
        archive.check().await.context("the object store")?;
        let keyring = Arc::new(Keyring::new(
            archive,
            masters.clone(),
            audit,
            Duration::from_secs(300),
        ));
        Ok(ClusterArchive {
            settings,
            master_hex,
            keyring,
            masters,
            keyed: Default::default(),
        })
    }

    /// This replica's keyring over the store.
    pub fn keyring(&self) -> &Arc<Keyring> {
        &self.keyring
    }

    /// Every tenant's master key.
    pub fn masters(&self) -> &Arc<TenantMasters> {
        &self.masters
    }

    /// What every node is configured with now.
    pub async fn node_settings(&self, store: &Store) -> anyhow::Result<NodeSettings> {
        let store_settings = match &self.settings.store {
            StoreConfig::Local(p) => StoreSettings {
                url: format!("file://{}", p.display()),
                ..Default::default()
            },
            StoreConfig::S3(c) => StoreSettings {
                url: StoreConfig::S3(c.clone()).to_string(),
                endpoint: c.endpoint.clone(),
                region: c.region.clone(),
                access_key_id: c.access_key_id.clone(),
                secret_access_key: c.secret_access_key.clone(),
            },
        };
        let tenant_kms = store
            .kms_tenants()
            .await?
            .into_iter()
            .filter_map(|(t, c)| match c {
                MasterKeyConfig::Kms {
                    key_id,
                    region,
                    endpoint,
                } => Some((
                    t,
                    KmsKey {
                        key_id,
                        region,
                        endpoint,
                    },
                )),
                MasterKeyConfig::Deployment => None,
            })
            .collect();
        Ok(NodeSettings {
            store: Some(store_settings),
            master_key: Some(self.master_hex.clone()),
            aws: aws_for_nodes(),
            tenant_kms,
            upload_interval_ms: self.settings.upload_interval.map(|d| d.as_millis() as u64),
            cache_max_bytes: self.settings.cache_max_bytes,
        })
    }

    /// Makes sure `tenant`'s key is in the store before any node archives for it: made
    /// once in the cluster, by whichever replica holds the claim; the others wait for it.
    pub async fn ensure_tenant_key(
        &self,
        store: &Store,
        holder: &str,
        tenant: &str,
    ) -> anyhow::Result<()> {
        if self
            .keyed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(tenant)
        {
            return Ok(());
        }
        let claim = format!("tenant-key:{tenant}");
        // Two creates of one new tenant in this replica must not both hold it.
        let holder = format!("{holder}/{}", crate::store::cluster::random_alnum(8));
        let holder = holder.as_str();
        let deadline = std::time::Instant::now() + TENANT_KEY_CLAIM;
        loop {
            if store
                .claim(&claim, holder, TENANT_KEY_CLAIM.as_millis() as u64)
                .await?
            {
                let made = self.keyring.ensure_tenant_key(tenant).await;
                store.release_claim(&claim, holder).await?;
                made.with_context(|| format!("the key of tenant {tenant}"))?;
                break;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "another replica has been making the key of tenant {tenant} for {}s",
                TENANT_KEY_CLAIM.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.keyed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tenant.to_owned());
        Ok(())
    }
}
