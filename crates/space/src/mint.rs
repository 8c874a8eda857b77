//! `space admin-key`: an admin key made on the host, written straight into the deployment's
//! state database. The API refuses to revoke the last admin key, but keys can still be lost
//! (a deleted config file, a key shown once and not kept); whoever can read the data directory
//! (or reach the database) owns the deployment anyway, so this needs no other credential.

use anyhow::{Context as _, Result};
use space_control::server::{redact, sqlite_file};
use space_control::store::{NewAuditEvent, Store, TenantName};

use crate::cli::AdminKeyArgs;

/// Mints the key, records the mint in the audit log and prints the key once.
pub async fn admin_key(a: AdminKeyArgs, json: bool) -> Result<()> {
    let tenant: TenantName = a
        .tenant
        .parse()
        .map_err(|e| anyhow::anyhow!("tenant {:?}: {e}", a.tenant))?;
    let database = match a.database {
        Some(d) => d,
        None => {
            let file = sqlite_file(&a.data_dir);
            if !file.is_file() {
                anyhow::bail!(
                    "{} holds no state database ({} is missing): is --data-dir the deployment's?",
                    a.data_dir.display(),
                    file.display()
                );
            }
            file.display().to_string()
        }
    };
    let store = Store::open_database(&database)
        .await
        .with_context(|| format!("opening the state database {}", redact(&database)))?;
    let key = store
        .create_key(&tenant, true, Some(&a.label))
        .await
        .with_context(|| format!("creating an admin key for tenant {tenant}"))?;
    store
        .record(NewAuditEvent {
            tenant: Some(tenant.clone()),
            key_id: None,
            sandbox: None,
            operation: "key.create".into(),
            result: "ok".into(),
            detail: Some(format!(
                "admin key {} of tenant {tenant}, minted on the host",
                key.info.id
            )),
        })
        .await
        .context("recording the mint in the audit log")?;
    if json {
        println!("{}", serde_json::to_string(&key)?);
    } else {
        eprintln!("Admin key for tenant {tenant} (shown only this once; keep it safe):");
        println!("{}", key.key);
    }
    Ok(())
}
