//! Credentials in bodies: what putting a value into a form body and scrubbing a response of
//! it cost. Three paths, each request on a new connection:
//!
//! - **direct**: straight to the upstream, the value in the form as the client would send it;
//! - **as is**: through a sandbox whose credential is bound to another host, so its tunnels
//!   are intercepted but the upstream's requests and responses pass unchanged (the form holds
//!   a placeholder-shaped string of the same length that is no secret's);
//! - **substituted**: through the sandbox whose credential is bound to the upstream: the
//!   placeholder in the form becomes the value (the body is read whole, searched, rewritten,
//!   sent with a new length) and the response is scrubbed (de-framed, searched for the
//!   value's forms, sent chunked).
//!
//! The ratio that matters is substituted against as is: the same interception, with and
//! without the work on bodies.

use super::*;

/// The 1 MiB response.
const ONE_MIB: u64 = 1 << 20;

/// The three paths, in table order.
const PATHS: [&str; 3] = ["direct", "as is", "substituted"];

/// The samples of the bodies part.
pub(super) struct BodiesSamples {
    form: [Samples; 3],
    mib: [Samples; 3],
}

impl BodiesSamples {
    /// Adds the ratios to the run's summary.
    pub(super) fn summarize(&self, summary: &mut Summary) {
        summary.add(
            "substituted / as is, form POST",
            &self.form[2],
            &self.form[1],
            "latency",
        );
        summary.add(
            "scrubbed / as is, 1 MiB response",
            &self.mib[2],
            &self.mib[1],
            "latency",
        );
    }
}

impl Setup {
    /// The form POST on path `i` of [`PATHS`]; answers its time.
    async fn form_post(&self, i: usize) -> Result<Duration> {
        let password = match i {
            0 => SECRET_VALUE.to_owned(),
            1 => format!("space-secret-{}", "0".repeat(32)),
            _ => self.placeholder.clone(),
        };
        let body = format!("user=bench&password={password}&remember=on");
        let request = format!(
            "POST /login HTTP/1.1\r\nHost: {UPSTREAM_HOST}:{}\r\nUser-Agent: space-bench\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.upstream.port,
            body.len()
        );
        self.timed(i, request.as_bytes(), SMALL_BODY as u64).await
    }

    /// One request on path `i`; its time, after checking the body's length.
    async fn timed(&self, i: usize, request: &[u8], want: u64) -> Result<Duration> {
        let start = Instant::now();
        let got = if i == 0 {
            let tcp = TcpStream::connect((UPSTREAM_HOST, self.upstream.port))
                .await
                .context("connecting to the upstream")?;
            tcp.set_nodelay(true)?;
            fetch(tcp, &self.upstream_tls, request).await?
        } else {
            let end = if i == 1 {
                &self.elsewhere
            } else {
                &self.intercepted
            };
            let tunnel = end.connect(UPSTREAM_HOST, self.upstream.port).await?;
            fetch(tunnel, &self.gateway_tls, request).await?
        };
        if got != want {
            bail!("{}: {got} body bytes instead of {want}", PATHS[i]);
        }
        Ok(start.elapsed())
    }

    /// `runs` rounds of a form POST and of a 1 MiB download per path (after uncounted ones);
    /// prints the tables.
    pub(super) async fn bodies(&self, runs: usize) -> Result<BodiesSamples> {
        progress("credentials in bodies: checking each path once");
        for (i, name) in PATHS.iter().enumerate() {
            tokio::time::timeout(SMALL_TIMEOUT, self.form_post(i))
                .await
                .map_err(|_| anyhow!("{name}: no answer within {SMALL_TIMEOUT:?}"))??;
            let body = String::from_utf8_lossy(&self.upstream.last_body()).into_owned();
            let want = if i == 1 {
                format!("space-secret-{}", "0".repeat(32))
            } else {
                SECRET_VALUE.to_owned()
            };
            if !body.contains(&format!("password={want}&")) {
                bail!("{name}: the upstream saw the form {body:?}");
            }
        }
        let mib_request = format!(
            "GET /one-mib HTTP/1.1\r\nHost: {UPSTREAM_HOST}:{}\r\nConnection: close\r\n\r\n",
            self.upstream.port
        );
        let mut form: [Samples; 3] = Default::default();
        let mut mib: [Samples; 3] = Default::default();
        let mib_runs = runs.div_ceil(4).max(1);
        for round in 0..WARMUP + runs {
            let counted = round >= WARMUP;
            if counted && (round - WARMUP + 1).is_multiple_of(50) {
                progress(&format!("form POSTs {}/{runs}", round - WARMUP + 1));
            }
            for k in 0..PATHS.len() {
                let i = (round + k) % PATHS.len();
                let t = tokio::time::timeout(SMALL_TIMEOUT, self.form_post(i))
                    .await
                    .map_err(|_| anyhow!("{}: no answer within {SMALL_TIMEOUT:?}", PATHS[i]))??;
                if counted {
                    form[i].push_duration(t);
                }
            }
        }
        for round in 0..2 + mib_runs {
            for k in 0..PATHS.len() {
                let i = (round + k) % PATHS.len();
                let t = tokio::time::timeout(
                    BIG_TIMEOUT,
                    self.timed(i, mib_request.as_bytes(), ONE_MIB),
                )
                .await
                .map_err(|_| anyhow!("{}: no 1 MiB answer within {BIG_TIMEOUT:?}", PATHS[i]))??;
                if round >= 2 {
                    mib[i].push_duration(t);
                }
            }
        }
        let mut t = Table::new(format!(
            "Form POST with a credential (POST /login, form body with the password), new \
             connection each: direct, intercepted as is, intercepted and substituted ({runs} \
             rounds)"
        ));
        for (i, name) in PATHS.iter().enumerate() {
            t.add(
                format!("{name}: request to response read"),
                "ms",
                form[i].clone(),
            );
        }
        print!("{}", t.render());
        println!();
        let mut t = Table::new(format!(
            "1 MiB response (GET /one-mib), new connection each: direct, intercepted as is, \
             intercepted and scrubbed ({mib_runs} rounds)"
        ));
        for (i, name) in PATHS.iter().enumerate() {
            let label = if i == 2 { "scrubbed" } else { name };
            t.add(
                format!("{label}: request to last byte"),
                "ms",
                mib[i].clone(),
            );
        }
        print!("{}", t.render());
        println!();
        for (what, s) in [("a form POST", &form), ("a 1 MiB response", &mib)] {
            if let (Some(a), Some(b)) = (s[2].percentile(50.0), s[1].percentile(50.0)) {
                println!(
                    "credentials in bodies add {} ms at p50 to {what}",
                    fmt_value(Some(a - b))
                );
            }
        }
        println!();
        Ok(BodiesSamples { form, mib })
    }
}
