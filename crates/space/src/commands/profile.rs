//! `space profile`: the deployments of the config file (`docs/cli.md`, *Profiles*).

use anyhow::{bail, Result};
use serde_json::json;

use crate::cli::ProfileCmd;
use crate::config::{self, DEFAULT_PROFILE};
use crate::output;

/// Runs a `space profile` command.
pub fn profile(cmd: ProfileCmd, as_json: bool) -> Result<()> {
    let path = config::config_path()?;
    let mut file = config::read(&path)?;
    let current = file
        .current
        .clone()
        .unwrap_or_else(|| DEFAULT_PROFILE.to_owned());
    match cmd {
        ProfileCmd::Ls => {
            let rows: Vec<(String, Option<String>, bool)> = file
                .names()
                .into_iter()
                .map(|n| {
                    let p = file.profile(&n).unwrap_or_default();
                    (n.clone(), p.url, p.api_key.is_some())
                })
                .collect();
            if as_json {
                let list: Vec<_> = rows
                    .iter()
                    .map(|(n, u, k)| json!({"name": n, "url": u, "has_key": k, "current": *n == current}))
                    .collect();
                output::json(&json!({"profiles": list, "config": path.display().to_string()}));
                return Ok(());
            }
            let table: Vec<Vec<String>> = rows
                .into_iter()
                .map(|(n, u, k)| {
                    vec![
                        if n == current {
                            "*".into()
                        } else {
                            String::new()
                        },
                        n,
                        u.unwrap_or_else(|| "-".into()),
                        if k { "yes".into() } else { "no".into() },
                    ]
                })
                .collect();
            output::print_table(&["", "PROFILE", "URL", "KEY"], &table);
        }
        ProfileCmd::Use { name } => {
            if file.profile(&name).is_none() {
                bail!(
                    "no profile {name:?} in {} (profiles: {})",
                    path.display(),
                    file.names().join(", ")
                );
            }
            file.current = (name != DEFAULT_PROFILE).then(|| name.clone());
            config::write(&path, &file)?;
            println!("the CLI now talks to profile {name} by default");
        }
        ProfileCmd::Rm { name } => {
            if name == DEFAULT_PROFILE {
                if file.url.is_none() && file.api_key.is_none() {
                    bail!("no profile default in {}", path.display());
                }
                file.url = None;
                file.api_key = None;
            } else if file.profiles.remove(&name).is_none() {
                bail!("no profile {name:?} in {}", path.display());
            }
            if file.current.as_deref() == Some(name.as_str()) {
                file.current = None;
            }
            config::write(&path, &file)?;
            println!("profile {name} removed");
        }
    }
    Ok(())
}
