//! The in-guest part of the egress group: `curl` inside real `base` guests through a node's
//! gateway, against host `curl` straight to the upstream.

use super::*;

/// The template the in-guest group builds (its image has `curl`).
const GUEST_TEMPLATE: &str = "base";
/// Uncounted `curl` runs before the counted ones, per path.
const GUEST_WARMUP: usize = 3;
/// Apparent size of the node's sparse btrfs image.
const GUEST_LOOP_IMAGE: u64 = 8 << 30;
/// How long a cold boot may take to report ready (TCG).
const GUEST_READY: Duration = Duration::from_secs(180);
/// Where the upstream's CA goes in the tunnel sandbox.
const GUEST_CA: &str = "/tmp/bench-upstream-ca.pem";

/// Where the guest daemon writes the deployment CA.
const DEPLOYMENT_CA: &str = "/usr/local/share/ca-certificates/space-ca.crt";

/// Runs `script` in the guest (bounded by `limit`) and parses its `curl -w` lines.
async fn guest_curl(
    guest: &space_proto::client::GuestClient,
    script: String,
    what: &str,
    limit: Duration,
) -> Result<CurlTimes> {
    progress(&format!("curl in the guest: {what}"));
    let mut spec = ExecSpec::shell(script);
    spec.timeout_ms = Some(limit.as_millis() as u64);
    let out = tokio::time::timeout(limit, guest.run(spec))
        .await
        .map_err(|_| anyhow!("curl in the guest ({what}) took over {limit:?}"))??;
    curl_times(&String::from_utf8_lossy(&out.stdout), what)
        .with_context(|| format!("stderr: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Timings `curl -w` reports, in ms.
#[derive(Default)]
struct CurlTimes {
    /// TLS with the server done (`time_appconnect`): through the proxy's CONNECT.
    tls: Samples,
    /// Response read (`time_total`).
    total: Samples,
}

/// The shell loop that runs `curl` `n` times against `url`, one line of `-w` output each.
fn curl_loop(n: usize, url: &str, cacert: Option<&str>, proxy: bool) -> String {
    let ca = cacert.map(|c| format!("--cacert {c} ")).unwrap_or_default();
    let proxy = if proxy {
        "--noproxy '' --proxy http://127.0.0.1:3128 "
    } else {
        ""
    };
    format!(
        "i=0; while [ $i -lt {n} ]; do i=$((i+1)); \
         curl -sS -m 30 -o /dev/null {proxy}{ca}-H \"Authorization: Bearer ${{{SECRET_NAME}:-none}}\" \
         -w '%{{http_code}} %{{time_appconnect}} %{{time_total}}\\n' {url} || echo failed; done"
    )
}

/// Parses the `curl -w` lines, drops the warm-up ones.
fn curl_times(out: &str, what: &str) -> Result<CurlTimes> {
    let mut times = CurlTimes::default();
    for (i, line) in out.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = match f.as_slice() {
            ["200", tls, total] => tls.parse::<f64>().ok().zip(total.parse::<f64>().ok()),
            _ => None,
        };
        let Some((tls, total)) = parsed else {
            bail!("{what}: curl reported {line:?}");
        };
        if i >= GUEST_WARMUP {
            times.tls.push(tls * 1e3);
            times.total.push(total * 1e3);
        }
    }
    Ok(times)
}

impl Setup {
    /// Boots `base` guests on a node whose gateway trusts the upstream's CA and knows the
    /// secret, and runs `curl` in them: a sandbox without credentials (tunnel) and one with
    /// the credential bound (intercepted); host `curl` straight to the upstream as reference.
    pub(super) async fn in_guest(
        &self,
        gp: &GuestPlan,
        dir: &DataDir,
        slot: &mut Option<Node>,
    ) -> Result<()> {
        let decision = space_runtime::accel::detect()?;
        let mut cfg = NodeConfig::new(dir.data());
        cfg.storage = StorageOptions {
            driver: Some(DriverKind::Btrfs),
            loop_image_size: GUEST_LOOP_IMAGE,
            loop_image: true,
        };
        cfg.qemu.qemu = gp.qemu.clone();
        cfg.qemu.accel = Some(decision.accel);
        cfg.qemu.detached = false;
        cfg.ready_timeout = GUEST_READY;
        cfg.rolling.enabled = false;
        cfg.pools = PoolConfig::disabled();
        cfg.gateway = GatewayConfig {
            extra_roots: vec![self.upstream_ca.1.clone()],
            secrets: Some(Arc::new(FixedSecret)),
            ..GatewayConfig::default()
        };
        progress("opening a node for the in-guest group");
        let node = Node::open(cfg)
            .await
            .context("opening the node (needs root for the loop-mounted btrfs image)")?;
        *slot = Some(node.clone());
        progress("building the base template");
        let t = Instant::now();
        node.build_template(TemplateSpec {
            template: TemplateRef::new(GUEST_TEMPLATE, "bench")?,
            kernel: gp.kernel.clone(),
            rootfs: gp.rootfs.clone(),
            vcpus: 1,
            memory_mib: 256,
            kernel_cmdline: None,
            ready_timeout: GUEST_READY,
            guest: Default::default(),
            start: None,
            source: String::new(),
        })
        .await
        .context("building the base template")?;
        let built = t.elapsed();
        let policy: space_node::EgressPolicy = serde_json::from_value(serde_json::json!({
            "default": "deny",
            "allow": [UPSTREAM_HOST],
        }))?;
        let mut plain = CreateRequest::new(GUEST_TEMPLATE.parse()?);
        plain.options.egress = policy.clone();
        let mut bound = CreateRequest::new(GUEST_TEMPLATE.parse()?);
        bound.options.egress = policy;
        bound.options.secrets = vec![SecretBinding::new(
            SECRET_NAME,
            vec![UPSTREAM_HOST
                .parse()
                .map_err(|e| anyhow!("the binding's rule: {e}"))?],
        )];
        let plain = node
            .create(plain)
            .await
            .context("creating the tunnel sandbox")?;
        let bound = node
            .create(bound)
            .await
            .context("creating the intercepted sandbox")?;
        let plain_guest = node.guest(&plain.id).await?;
        let bound_guest = node.guest(&bound.id).await?;
        let put_ca = format!("cat > {GUEST_CA} <<'EOF'\n{}EOF\n", self.upstream_ca.0);
        let out = plain_guest.run(ExecSpec::shell(put_ca)).await?;
        if !out.status.success() {
            bail!("writing the CA in the guest: {:?}", out.status);
        }
        println!(
            "in-guest:    {} ({}), kernel {}; template {GUEST_TEMPLATE} ({}) built in {:.1} s; \
             curl in the guest through its proxy (127.0.0.1:3128, space.egress) to \
             https://{UPSTREAM_HOST}:{}/small",
            decision.accel.as_str().to_uppercase(),
            decision.reason,
            kernel_version(&gp.kernel).unwrap_or_else(|| "version string not found".into()),
            gp.rootfs.display(),
            built.as_secs_f64(),
            self.upstream.port
        );
        let url = format!("https://{UPSTREAM_HOST}:{}/small", self.upstream.port);
        let n = GUEST_WARMUP + gp.runs;
        let limit = Duration::from_secs(60) + Duration::from_secs(10) * n as u32;
        let tunnel = guest_curl(
            &plain_guest,
            curl_loop(n, &url, Some(GUEST_CA), true),
            "tunnel",
            limit,
        )
        .await?;
        let intercepted = guest_curl(
            &bound_guest,
            curl_loop(n, &url, Some(DEPLOYMENT_CA), true),
            "intercepted",
            limit,
        )
        .await?;
        let bundle = guest_curl(
            &bound_guest,
            curl_loop(n, &url, None, true),
            "intercepted, system bundle",
            limit,
        )
        .await?;
        if self.upstream.last_auth().as_deref() != Some(&format!("Bearer {SECRET_VALUE}")) {
            bail!(
                "the upstream saw `Authorization: {}` from the intercepted sandbox",
                self.upstream.last_auth().unwrap_or_default()
            );
        }
        progress(&format!("{n} curl runs on the host"));
        let host_ca = self.dir.path().join("host-ca.pem");
        std::fs::write(&host_ca, &self.upstream_ca.0)?;
        let out = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(curl_loop(n, &url, host_ca.to_str(), false))
            .env(SECRET_NAME, SECRET_VALUE)
            .output()
            .await
            .context("running curl on the host")?;
        let host = curl_times(&String::from_utf8_lossy(&out.stdout), "host")
            .with_context(|| format!("stderr: {}", String::from_utf8_lossy(&out.stderr)))?;
        let mut t = Table::new(format!(
            "curl for GET /small inside a real guest ({}: the guest CPU, and with it TLS in \
             the guest, is emulated) against host curl straight to the upstream ({} runs each \
             after {GUEST_WARMUP} uncounted; curl's own -w timings, process start excluded; \
             --cacert with the one CA that signs what the guest sees, or the guest's system \
             bundle as processes get it)",
            decision.accel.as_str().to_uppercase(),
            gp.runs
        ));
        t.add("host curl, direct: TLS done", "ms", host.tls);
        t.add("host curl, direct: response read", "ms", host.total);
        t.add("guest curl, tunnel: TLS done", "ms", tunnel.tls);
        t.add(
            "guest curl, tunnel: response read",
            "ms",
            tunnel.total.clone(),
        );
        t.add("guest curl, intercepted: TLS done", "ms", intercepted.tls);
        t.add(
            "guest curl, intercepted: response read",
            "ms",
            intercepted.total.clone(),
        );
        t.add(
            "guest curl, intercepted, system bundle: TLS done",
            "ms",
            bundle.tls,
        );
        t.add(
            "guest curl, intercepted, system bundle: response read",
            "ms",
            bundle.total,
        );
        print!("{}", t.render());
        if let (Some(a), Some(b)) = (
            intercepted.total.percentile(50.0),
            tunnel.total.percentile(50.0),
        ) {
            println!(
                "in the guest, interception adds {} ms at p50",
                fmt_value(Some(a - b))
            );
        }
        println!();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curl_lines_parse() {
        let out = "200 0.010 0.020\n".repeat(GUEST_WARMUP) + "200 0.001500 0.002500\n";
        let t = curl_times(&out, "x").unwrap();
        assert_eq!(t.tls.len(), 1);
        assert_eq!(t.tls.percentile(50.0), Some(1.5));
        assert_eq!(t.total.percentile(50.0), Some(2.5));
        assert!(curl_times("failed\n", "x").is_err());
        assert!(curl_times("403 0.0 0.1\n", "x").is_err());
        let script = curl_loop(3, "https://localhost:1/small", Some("/ca.pem"), true);
        assert!(script.contains("--cacert /ca.pem "), "{script}");
        assert!(script.contains("${BENCH_TOKEN:-none}"), "{script}");
        assert!(script.contains("%{time_appconnect}"), "{script}");
    }
}
