//! Volumes: a tenant's named file systems (`docs/volumes.md`). The row says which node
//! keeps the volume's files (`None` on a single node, and in a cluster until it is placed).

use super::*;

/// A volume as the control plane knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    /// `vol-` and 16 hex digits.
    pub id: String,
    pub tenant: TenantName,
    /// Unique within the tenant.
    pub name: String,
    /// Writes past it are refused.
    pub size_bytes: u64,
    /// The node that keeps its files.
    pub node: Option<String>,
    pub created_unix_ms: u64,
}

const COLUMNS: &str = "id, tenant, name, size_bytes, node, created_ms";

fn volume_row(row: &Row) -> Result<VolumeRow, StoreError> {
    Ok(VolumeRow {
        id: row.text(0)?,
        tenant: tenant_from_db(row.text(1)?)?,
        name: row.text(2)?,
        size_bytes: from_db(row.int(3)?),
        node: row.opt_text(4)?,
        created_unix_ms: from_db(row.int(5)?),
    })
}

impl Store {
    /// Records a new volume; `Conflict` when the tenant has one of that name, `NotFound` for
    /// an unknown tenant.
    pub async fn insert_volume(&self, row: &VolumeRow) -> Result<(), StoreError> {
        let row = row.clone();
        self.write(move |c| {
            if get_tenant(c, &row.tenant)?.is_none() {
                return Err(StoreError::NotFound {
                    what: "tenant",
                    id: row.tenant.to_string(),
                });
            }
            let taken = one(
                c,
                "SELECT id FROM volumes WHERE tenant = $1 AND name = $2",
                args![row.tenant.as_str(), row.name.as_str()],
                |r| r.text(0),
            )?;
            if taken.is_some() {
                return Err(StoreError::Conflict(format!(
                    "the tenant has a volume named {} already",
                    row.name
                )));
            }
            c.execute(
                "INSERT INTO volumes (id, tenant, name, size_bytes, node, created_ms)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                args![
                    row.id.as_str(),
                    row.tenant.as_str(),
                    row.name.as_str(),
                    to_db(row.size_bytes),
                    row.node.as_deref(),
                    to_db(row.created_unix_ms)
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// The tenant's volumes, by name.
    pub async fn volumes(&self, tenant: &TenantName) -> Result<Vec<VolumeRow>, StoreError> {
        let tenant = tenant.to_string();
        self.read(move |c| {
            rows(
                c,
                &format!("SELECT {COLUMNS} FROM volumes WHERE tenant = $1 ORDER BY name"),
                args![tenant.as_str()],
                volume_row,
            )
        })
        .await
    }

    /// The tenant's volume `name`.
    pub async fn volume(
        &self,
        tenant: &TenantName,
        name: &str,
    ) -> Result<Option<VolumeRow>, StoreError> {
        let (tenant, name) = (tenant.to_string(), name.to_owned());
        self.read(move |c| {
            one(
                c,
                &format!("SELECT {COLUMNS} FROM volumes WHERE tenant = $1 AND name = $2"),
                args![tenant.as_str(), name.as_str()],
                volume_row,
            )
        })
        .await
    }

    /// The volume of id `id`, whoever's it is.
    pub async fn volume_by_id(&self, id: &str) -> Result<Option<VolumeRow>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            one(
                c,
                &format!("SELECT {COLUMNS} FROM volumes WHERE id = $1"),
                args![id.as_str()],
                volume_row,
            )
        })
        .await
    }

    /// The sizes of the tenant's volumes, summed.
    pub async fn volume_bytes(&self, tenant: &TenantName) -> Result<u64, StoreError> {
        Ok(self
            .volumes(tenant)
            .await?
            .iter()
            .map(|v| v.size_bytes)
            .sum())
    }

    /// Names the node that keeps volume `id`.
    pub async fn set_volume_node(&self, id: &str, node: &str) -> Result<(), StoreError> {
        let (id, node) = (id.to_owned(), node.to_owned());
        self.write(move |c| {
            c.execute(
                "UPDATE volumes SET node = $2 WHERE id = $1",
                args![id.as_str(), node.as_str()],
            )?;
            Ok(())
        })
        .await
    }

    /// Names `to` the node that keeps volume `id` if `from` still does; whether it moved
    /// (another replica may have moved it first).
    pub async fn move_volume(&self, id: &str, from: &str, to: &str) -> Result<bool, StoreError> {
        let (id, from, to) = (id.to_owned(), from.to_owned(), to.to_owned());
        self.write(move |c| {
            Ok(c.execute(
                "UPDATE volumes SET node = $3 WHERE id = $1 AND node = $2",
                args![id.as_str(), from.as_str(), to.as_str()],
            )? > 0)
        })
        .await
    }

    /// Forgets volume `id`; whether it was there.
    pub async fn delete_volume(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.write(move |c| {
            Ok(c.execute("DELETE FROM volumes WHERE id = $1", args![id.as_str()])? > 0)
        })
        .await
    }
}
