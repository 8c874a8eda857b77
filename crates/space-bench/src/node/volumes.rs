//! The volume phase of the node group: a volume mounted in a sandbox against the sandbox's
//! own disk, in the same guest and run, alternating: sequential 64 MiB written (and synced)
//! and read back (caches dropped first), and 1,000 small files made and then listed with
//! their attributes. Each is one shell line in the guest, timed from the host.

use space_node::{SandboxOptions, VolumeMount};

use super::*;

/// The volume the phase makes.
const VOLUME: &str = "vol-00000000000be0c4";

/// Where each side's files go.
const SIDES: [(&str, &str); 2] = [("own disk", "/root/bench"), ("volume", "/vol/bench")];

/// What each step runs, `$D` being the side's directory.
const STEPS: [(&str, &str); 4] = [
    (
        "write 64 MiB (dd, then fsync)",
        "dd if=/dev/zero of=$D/big bs=1M count=64 conv=fsync 2>/dev/null",
    ),
    (
        "read 64 MiB (caches dropped)",
        "echo 3 > /proc/sys/vm/drop_caches; dd if=$D/big of=/dev/null bs=1M 2>/dev/null",
    ),
    (
        "create 1,000 empty files",
        "mkdir $D/m && i=0; while [ $i -lt 1000 ]; do : > $D/m/f$i; i=$((i+1)); done",
    ),
    ("stat 1,000 files (ls -l)", "ls -l $D/m > /dev/null"),
];

impl NodeBench<'_> {
    /// One sandbox with a volume at `/vol`; every step on both sides, `runs` times.
    pub(super) async fn volumes(&mut self) -> Result<()> {
        progress("volumes: making the volume and its sandbox");
        self.node
            .create_volume(VOLUME, "bench", 4 << 30)
            .await
            .context("creating the volume")?;
        let mut req = self.request();
        req.options = SandboxOptions {
            volumes: vec![VolumeMount {
                volume: VOLUME.into(),
                name: "bench".into(),
                path: "/vol".into(),
                read_only: false,
            }],
            ..SandboxOptions::default()
        };
        let info = self.node.create(req).await.context("create")?;
        self.alive.push(info.id.clone());
        let client = self.node.guest(&info.id).await.context("guest")?;
        let mut samples: Vec<[Samples; 2]> = STEPS
            .iter()
            .map(|_| [Samples::new(), Samples::new()])
            .collect();
        for run in 0..self.plan.runs {
            progress(&format!("volumes: run {} of {}", run + 1, self.plan.runs));
            // Alternate which side goes first, so drift does not favour one.
            let order: [usize; 2] = if run % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                let dir = SIDES[side].1;
                let clean = format!("rm -rf {dir} && mkdir -p {dir}");
                run_line(&client, &clean).await?;
                for (k, (_, line)) in STEPS.iter().enumerate() {
                    let line = format!("D={dir}; {line}");
                    let t = Instant::now();
                    run_line(&client, &line).await?;
                    samples[k][side].push_duration(t.elapsed());
                }
            }
        }
        let mut t = Table::new(format!(
            "A volume (FUSE over the uplink) against the sandbox's own disk (virtio-blk), one \
             guest, {} runs alternating; each step one shell line timed from the host",
            self.plan.runs
        ));
        let mut ratios = Vec::new();
        for (k, (name, _)) in STEPS.iter().enumerate() {
            let [own, vol] = std::mem::replace(&mut samples[k], [Samples::new(), Samples::new()]);
            if let (Some(o), Some(v)) = (own.percentile(50.0), vol.percentile(50.0)) {
                let line = if k < 2 {
                    // 64 MiB over the time: the rate each side moved.
                    let rate = |ms: f64| 64.0 / (ms / 1000.0);
                    format!(
                        "{name}: volume / own disk {:.2}x the time (p50; {:.0} MiB/s own disk, \
                         {:.0} MiB/s volume, {:.2}x the throughput)",
                        v / o,
                        rate(o),
                        rate(v),
                        o / v
                    )
                } else {
                    format!("{name}: volume / own disk {:.2}x the time (p50)", v / o)
                };
                ratios.push(line);
            }
            t.add(format!("{name}, own disk"), "ms", own);
            t.add(format!("{name}, volume"), "ms", vol);
        }
        print!("{}", t.render());
        for r in ratios {
            println!("{r}");
        }
        println!();
        let id = info.id.clone();
        self.kill(&id).await?;
        self.node
            .delete_volume(VOLUME)
            .await
            .context("deleting the volume")?;
        Ok(())
    }
}

async fn run_line(client: &space_proto::GuestClient, line: &str) -> Result<()> {
    let mut spec = ExecSpec::shell(line);
    spec.timeout_ms = Some(600_000);
    let out = client.run(spec).await.context("exec")?;
    if !out.status.success() {
        bail!(
            "`{line}` failed: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
