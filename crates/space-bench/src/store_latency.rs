//! Reading one object from the store, by size: through the store's client
//! (`space_archive`, which acknowledges what it reads at once) and through object_store's
//! own client, on the same objects in the same run. A restore reads a manifest, the device
//! state and compressed chunks of a few KiB to a few hundred KiB; a store that holds a
//! small body until its headers are acknowledged (Garage does) costs each of them the
//! receiver's delayed acknowledgement with the default client.

use std::time::Instant;

use anyhow::{Context as _, Result};
use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};
use space_archive::Archive;

use crate::stats::{Samples, Summary, Table};

/// Object sizes read, in bytes.
const SIZES: &[usize] = &[4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];
/// Reads of each size through each client.
const READS: usize = 20;

fn label(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

/// object_store's own client for the same bucket, from the environment the node's store
/// client reads (`AWS_ENDPOINT_URL` and the keys).
fn default_client(bucket: &str) -> Result<Box<dyn ObjectStore>> {
    let s3 = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_virtual_hosted_style_request(false)
        .with_allow_http(true)
        .build()
        .context("object_store's own S3 client")?;
    Ok(Box::new(s3))
}

/// Writes one object per size under `bench/latency/` and reads each `READS` times through
/// both clients, alternating. `bucket` is the store's bucket; the archive's prefix is
/// `prefix`.
pub async fn measure(archive: &Archive, bucket: &str, prefix: &str) -> Result<(Table, Summary)> {
    let other = default_client(bucket)?;
    let mut table = Table::new("Reading one object from the store (ms)");
    let mut summary = Summary::new();
    for &size in SIZES {
        let rel = format!("latency/{size}");
        let p = ObjPath::from(rel.as_str());
        let full = ObjPath::from(format!("{prefix}/{rel}"));
        let data = Bytes::from(space_archive::testing::noise(size as u64, size));
        archive
            .put(&p, data)
            .await
            .context("writing a test object")?;
        let (mut ours, mut theirs) = (Samples::new(), Samples::new());
        for _ in 0..READS {
            let t = Instant::now();
            archive
                .get_bounded(&p, size as u64)
                .await
                .context("reading through the store's client")?;
            ours.push_duration(t.elapsed());
            let t = Instant::now();
            other
                .get(&full)
                .await
                .context("reading through object_store's client")?
                .bytes()
                .await?;
            theirs.push_duration(t.elapsed());
        }
        archive.delete(&p).await.ok();
        let l = label(size);
        summary.add(
            format!("{l}: store client / object_store's"),
            &ours,
            &theirs,
            "same objects, same run",
        );
        table.add(format!("{l}: the store's client"), "ms", ours);
        table.add(format!("{l}: object_store's own client"), "ms", theirs);
    }
    Ok((table, summary))
}
