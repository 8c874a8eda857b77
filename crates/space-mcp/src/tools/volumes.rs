//! Volume tools: list the tenant's volumes and make one. A sandbox mounts volumes at its
//! create (`create_sandbox`'s `volumes`); their files are then read and written with the
//! file and command tools at the mount path.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{args, Done, Result, Spec};
use crate::api::Conn;

/// Arguments of create_volume.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeArgs {
    /// Its name: 1 to 64 letters, digits, `-` and `_`, unique among your volumes.
    pub name: String,
    /// Its size in MiB (10240 when left out); writes past it fail with "no space".
    #[serde(default)]
    pub size_mib: Option<u64>,
}

/// No arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// The volume tools.
pub const TOOLS: &[Spec] = &[
    Spec {
        name: "list_volumes",
        title: "List volumes",
        description: "List your volumes: file systems that outlive sandboxes (name, size, \
                      bytes used). create_sandbox's `volumes` mounts them.",
        schema: super::schema::<NoArgs>,
        read_only: true,
        destructive: false,
    },
    Spec {
        name: "create_volume",
        title: "Create a volume",
        description: "Make a volume: a file system that outlives sandboxes and that several \
                      sandboxes can mount at once (create_sandbox's `volumes`), for datasets, \
                      caches and work to keep.",
        schema: super::schema::<CreateVolumeArgs>,
        read_only: false,
        destructive: false,
    },
];

fn brief(v: &space_api::Volume) -> serde_json::Value {
    json!({"name": v.name, "size_bytes": v.size_bytes, "used_bytes": v.used_bytes})
}

/// Calls volume tool `name`; `None` when it is not one.
pub async fn call(conn: &Conn, name: &str, raw: serde_json::Value) -> Option<Result<Done>> {
    Some(match name {
        "list_volumes" => match args::<NoArgs>(name, raw) {
            Ok(_) => match conn.ops.volumes(&conn.who).await {
                Ok(list) => Ok(Done::json(
                    json!({"volumes": list.iter().map(brief).collect::<Vec<_>>()}),
                )),
                Err(e) => Err(e.into()),
            },
            Err(e) => Err(e),
        },
        "create_volume" => match args::<CreateVolumeArgs>(name, raw) {
            Ok(a) => match conn.ops.create_volume(&conn.who, &a.name, a.size_mib).await {
                Ok(v) => Ok(Done::json(json!({"created": brief(&v)}))),
                Err(e) => Err(e.into()),
            },
            Err(e) => Err(e),
        },
        _ => return None,
    })
}
