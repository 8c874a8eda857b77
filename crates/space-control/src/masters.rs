//! Which master key wraps each tenant's archive key (`docs/archive.md`): the deployment's key
//! file unless an admin gives the tenant a KMS key of its own (customer-held keys), through
//! `PUT /v1/tenants/{name}/master-key` or `space tenant master-key`.
//!
//! Changing it rewraps the tenant key from the old master onto the new one (one object in the
//! store; no chunk is rewritten), then records the choice. The AWS credentials that reach
//! KMS are the deployment's (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`); a tenant grants them use of its key in its own KMS policy.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use space_archive::kms::{KmsConfig, KmsMaster, ID_PREFIX};
use space_archive::{BoxFuture, KeyError, MasterDescription, MasterKey, MasterResolver};

use crate::store::sql::args;
use crate::store::{Store, StoreError, TenantName};

/// A tenant's master key choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "snake_case", deny_unknown_fields)]
pub enum MasterKeyConfig {
    /// The deployment's own key file.
    Deployment,
    /// A key in the AWS KMS API (AWS or a compatible service).
    Kms {
        /// Key id, ARN or alias.
        key_id: String,
        /// Its region.
        region: String,
        /// Endpoint URL of a compatible service; `None`: AWS's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<String>,
    },
}

impl MasterKeyConfig {
    /// Checks the fields an admin sent.
    pub fn validate(&self) -> Result<(), String> {
        if let MasterKeyConfig::Kms {
            key_id,
            region,
            endpoint,
        } = self
        {
            let ok = |s: &str| !s.is_empty() && s.len() <= 2048 && !s.chars().any(char::is_control);
            if !ok(key_id) || !ok(region) {
                return Err("a KMS master key needs a key_id and a region".into());
            }
            if let Some(e) = endpoint {
                if !(e.starts_with("https://") || e.starts_with("http://")) || !ok(e) {
                    return Err(format!("endpoint {e:?} is not an http(s) URL"));
                }
            }
        }
        Ok(())
    }
}

impl Store {
    /// The tenant's master key choice (the deployment's when none was set).
    pub async fn master_key_config(
        &self,
        tenant: &TenantName,
    ) -> Result<MasterKeyConfig, StoreError> {
        let tenant = tenant.clone();
        let row = self
            .read(move |c| {
                c.one(
                    "SELECT provider, key_id, region, endpoint FROM tenant_master_keys \
                     WHERE tenant = $1",
                    args![tenant.as_str()],
                )?
                .map(|r| Ok((r.text(0)?, r.text(1)?, r.text(2)?, r.opt_text(3)?)))
                .transpose()
            })
            .await?;
        Ok(match row {
            Some((p, key_id, region, endpoint)) if p == "kms" => MasterKeyConfig::Kms {
                key_id,
                region,
                endpoint,
            },
            _ => MasterKeyConfig::Deployment,
        })
    }

    /// Every tenant that has a KMS key of its own, with it.
    pub async fn kms_tenants(&self) -> Result<Vec<(String, MasterKeyConfig)>, StoreError> {
        self.read(|c| {
            let rows = c.query(
                "SELECT tenant, key_id, region, endpoint FROM tenant_master_keys \
                 WHERE provider = 'kms' ORDER BY tenant",
                args![],
            )?;
            rows.into_iter()
                .map(|r| {
                    Ok((
                        r.text(0)?,
                        MasterKeyConfig::Kms {
                            key_id: r.text(1)?,
                            region: r.text(2)?,
                            endpoint: r.opt_text(3)?,
                        },
                    ))
                })
                .collect()
        })
        .await
    }

    /// Records the tenant's master key choice.
    pub async fn set_master_key_config(
        &self,
        tenant: &TenantName,
        config: &MasterKeyConfig,
    ) -> Result<(), StoreError> {
        let (tenant, config) = (tenant.clone(), config.clone());
        self.write(move |c| {
            match &config {
                MasterKeyConfig::Deployment => {
                    c.execute(
                        "DELETE FROM tenant_master_keys WHERE tenant = $1",
                        args![tenant.as_str()],
                    )?;
                }
                MasterKeyConfig::Kms {
                    key_id,
                    region,
                    endpoint,
                } => {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis() as i64)
                        .unwrap_or(0);
                    c.execute(
                        "INSERT INTO tenant_master_keys (tenant, provider, key_id, region, endpoint, updated_unix_ms)
                         VALUES ($1, 'kms', $2, $3, $4, $5)
                         ON CONFLICT (tenant) DO UPDATE SET provider = 'kms', key_id = $2,
                           region = $3, endpoint = $4, updated_unix_ms = $5",
                        args![tenant.as_str(), key_id, region, endpoint.as_deref(), now],
                    )?;
                }
            }
            Ok(())
        })
        .await
    }
}

/// The AWS credentials KMS calls are signed with, from the environment.
#[derive(Clone)]
struct AwsCredentials {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

/// The AWS credentials of this process's environment, as nodes of a cluster get them.
pub fn aws_for_nodes() -> Option<space_node_api::settings::AwsCredentials> {
    AwsCredentials::from_env().map(|c| space_node_api::settings::AwsCredentials {
        access_key_id: c.access_key_id,
        secret_access_key: c.secret_access_key,
        session_token: c.session_token,
    })
}

impl AwsCredentials {
    fn from_env() -> Option<AwsCredentials> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Some(AwsCredentials {
            access_key_id: get("AWS_ACCESS_KEY_ID")?,
            secret_access_key: get("AWS_SECRET_ACCESS_KEY")?,
            session_token: get("AWS_SESSION_TOKEN"),
        })
    }
}

/// Every tenant's master key, from the state store (connected once it is open; until then
/// every tenant uses the deployment's key for new tenant keys, and existing ones are opened
/// by what their objects in the store say).
pub struct TenantMasters {
    store: OnceLock<Arc<Store>>,
    deployment: Arc<dyn MasterKey>,
    credentials: Option<AwsCredentials>,
}

impl TenantMasters {
    /// Masters over the deployment's key, with KMS credentials from the environment.
    pub fn new(deployment: Arc<dyn MasterKey>) -> TenantMasters {
        TenantMasters {
            store: OnceLock::new(),
            deployment,
            credentials: AwsCredentials::from_env(),
        }
    }

    /// Connects the state store.
    pub fn connect(&self, store: Arc<Store>) {
        let _ = self.store.set(store);
    }

    /// The master key a configuration names.
    pub fn build(&self, config: &MasterKeyConfig) -> Result<Arc<dyn MasterKey>, KeyError> {
        match config {
            MasterKeyConfig::Deployment => Ok(self.deployment.clone()),
            MasterKeyConfig::Kms {
                key_id,
                region,
                endpoint,
            } => {
                let Some(c) = &self.credentials else {
                    return Err(KeyError::Master {
                        key: format!("{ID_PREFIX}{key_id}"),
                        tenant: String::new(),
                        detail: "no AWS credentials: set AWS_ACCESS_KEY_ID and \
                                 AWS_SECRET_ACCESS_KEY for the server"
                            .into(),
                    });
                };
                Ok(Arc::new(KmsMaster::new(KmsConfig {
                    key_id: key_id.clone(),
                    region: region.clone(),
                    endpoint: endpoint.clone(),
                    access_key_id: c.access_key_id.clone(),
                    secret_access_key: c.secret_access_key.clone(),
                    session_token: c.session_token.clone(),
                })?))
            }
        }
    }

    /// The configured choice of `tenant`.
    pub async fn config(&self, tenant: &str) -> Result<MasterKeyConfig, KeyError> {
        let (Some(store), Ok(name)) = (self.store.get(), tenant.parse::<TenantName>()) else {
            return Ok(MasterKeyConfig::Deployment);
        };
        store
            .master_key_config(&name)
            .await
            .map_err(|e| KeyError::Master {
                key: "?".into(),
                tenant: tenant.to_owned(),
                detail: e.to_string(),
            })
    }

    async fn resolve_for(
        &self,
        tenant: &str,
        described: &MasterDescription,
    ) -> Result<Arc<dyn MasterKey>, KeyError> {
        if described.id == self.deployment.id() {
            return Ok(self.deployment.clone());
        }
        if let Some(key_id) = described.id.strip_prefix(ID_PREFIX) {
            let (region, endpoint) = match &described.region {
                Some(r) => (r.clone(), described.endpoint.clone()),
                None => match self.config(tenant).await? {
                    MasterKeyConfig::Kms {
                        region, endpoint, ..
                    } => (region, endpoint),
                    MasterKeyConfig::Deployment => {
                        return Err(KeyError::Master {
                            key: described.id.clone(),
                            tenant: tenant.to_owned(),
                            detail: "the tenant key names a KMS key without a region".into(),
                        })
                    }
                },
            };
            return self.build(&MasterKeyConfig::Kms {
                key_id: key_id.to_owned(),
                region,
                endpoint,
            });
        }
        Err(KeyError::Master {
            key: described.id.clone(),
            tenant: tenant.to_owned(),
            detail: format!(
                "the tenant key is wrapped by {}, which this deployment does not have (its \
                 master key is {})",
                described.id,
                self.deployment.id()
            ),
        })
    }
}

impl MasterResolver for TenantMasters {
    fn master<'a>(
        &'a self,
        tenant: &'a str,
    ) -> BoxFuture<'a, Result<Arc<dyn MasterKey>, KeyError>> {
        Box::pin(async move { self.build(&self.config(tenant).await?) })
    }

    fn master_for<'a>(
        &'a self,
        tenant: &'a str,
        described: &'a MasterDescription,
    ) -> BoxFuture<'a, Result<Arc<dyn MasterKey>, KeyError>> {
        Box::pin(self.resolve_for(tenant, described))
    }
}
