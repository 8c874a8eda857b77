//! A browser for automation clients: the sandbox's Chromium, started on demand with its
//! DevTools endpoint on `127.0.0.1:9222` inside the guest (headful on the desktop's display:
//! the one that runs, or an X server started for it where the template has one; headless in
//! templates without X), its profile on the sandbox's disk
//! (`/home/user/.config/space-browser`), so cookies and logins live with the sandbox through
//! pause, suspend, restore elsewhere, rollback and fork.
//!
//! Clients reach DevTools through the API (`/v1/sandboxes/{id}/browser/cdp`), never the guest
//! port itself: each connection reads the browser's current WebSocket path from its
//! `/json/version`, so a Chromium restart, a suspend and a wake on access keep the URL
//! working. The URL is authenticated by the API key header, or by a token in its query made
//! with the deployment's MAC key ([`token`]) for clients that cannot send headers. The live
//! view (noVNC on port 6081, behind an x11vnc of its own on the display) is reached the same way, its
//! token in the path.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use space_api::ExecEvent;
use space_node_api::SandboxId;

use super::Shared;
use crate::error::{ApiError, ApiResult};
use crate::store::Principal;

/// The DevTools port inside the guest.
pub const CDP_PORT: u16 = 9222;
/// The live view's noVNC port inside the guest (6080, where e2b-desktop puts its stream, is
/// left to the SDK).
pub const LIVE_PORT: u16 = 6081;
/// How long a token of a CDP or live-view URL is good for.
pub const TOKEN_TTL: Duration = Duration::from_secs(3600);
/// How long Chromium may take to open its DevTools port under TCG.
const START_TIMEOUT_MS: u64 = 180_000;

/// Starts Chromium when its DevTools port does not answer, and the live view when there is a
/// display; prints `headful` or `headless`. Runs as `user`.
const START: &str = r#"set -u
profile="$HOME/.config/space-browser"
log=/tmp/space-browser.log
ready() { curl -fsS -m 2 http://127.0.0.1:9222/json/version >/dev/null 2>&1; }
display=""
# A display answers on :0 (through its abstract socket: the e2b-desktop SDK starts Xvfb with
# -nolisten unix, which leaves no /tmp/.X11-unix/X0).
if command -v xdpyinfo >/dev/null 2>&1 && xdpyinfo -display :0 >/dev/null 2>&1; then display=:0; fi
# A template that has an X server (desktop) but runs none yet gets one for the browser: the X
# server and the window manager only, in a few seconds, not Xfce's whole session (tens of
# seconds under TCG; the e2b-desktop SDK and the MCP tools start that when they need it).
if [ -z "$display" ] && ! ready && command -v Xvfb >/dev/null 2>&1; then
    setsid Xvfb :0 -ac -screen 0 1280x800x24 -nolisten tcp </dev/null >/tmp/space-xvfb.log 2>&1 &
    i=0
    until xdpyinfo -display :0 >/dev/null 2>&1; do
        i=$((i + 1)); [ "$i" -gt 60 ] && break; sleep 0.5
    done
    if xdpyinfo -display :0 >/dev/null 2>&1; then
        display=:0
        command -v xfwm4 >/dev/null 2>&1 &&
            (DISPLAY=:0 setsid xfwm4 --compositor=off </dev/null >/tmp/space-xfwm4.log 2>&1 &)
    fi
fi
if ! ready; then
    command -v chromium >/dev/null 2>&1 || { echo "this sandbox's template has no chromium (use template desktop)" >&2; exit 3; }
    mkdir -p "$profile"
    # A profile copied from another sandbox (a fork, a restore elsewhere) holds the lock of a
    # browser that does not run here.
    rm -f "$profile/SingletonLock" "$profile/SingletonSocket" "$profile/SingletonCookie"
    mode="--headless=new"
    [ -n "$display" ] && mode="--start-maximized"
    # The gateway is the way out; Chromium reads no proxy variables by itself.
    proxy=""
    [ -n "${HTTP_PROXY:-}" ] && proxy="--proxy-server=$HTTP_PROXY"
    # Chromium trusts its own certificate store (NSS), not the system bundle: the gateway's
    # CA goes there, so intercepted HTTPS (secrets, logins) is trusted as curl trusts it.
    ca=/usr/local/share/ca-certificates/space-ca.crt
    if [ -f "$ca" ] && command -v certutil >/dev/null 2>&1; then
        mkdir -p "$HOME/.pki/nssdb"
        [ -f "$HOME/.pki/nssdb/cert9.db" ] || certutil -d "sql:$HOME/.pki/nssdb" -N --empty-password >/dev/null 2>&1
        certutil -d "sql:$HOME/.pki/nssdb" -A -t "C,," -n space-gateway -i "$ca" >/dev/null 2>&1 || true
    fi
    DISPLAY="$display" setsid chromium $mode $proxy --remote-debugging-address=127.0.0.1 \
        --remote-debugging-port=9222 --user-data-dir="$profile" --no-first-run \
        --no-default-browser-check --password-store=basic about:blank \
        </dev/null >"$log" 2>&1 &
    i=0
    until ready; do
        i=$((i + 1))
        if [ "$i" -gt 170 ]; then echo "chromium did not open its DevTools port:" >&2; tail -n 20 "$log" >&2; exit 4; fi
        sleep 1
    done
fi
if [ -n "$display" ]; then
    # The live view: an x11vnc of its own (under its own process name, on 5901) and noVNC on
    # 6081, apart from the e2b-desktop SDK's stream (x11vnc on 5900, noVNC on 6080), which
    # finds, starts and stops its own by name and port.
    if ! pgrep -x space-live-vnc >/dev/null 2>&1; then
        mkdir -p /tmp/.space-live && ln -sfn "$(command -v x11vnc)" /tmp/.space-live/space-live-vnc
        /tmp/.space-live/space-live-vnc -bg -display :0 -forever -shared -rfbport 5901 -localhost -nopw -quiet >/dev/null 2>&1 || true
    fi
    if ! curl -fsS -m 2 -o /dev/null http://127.0.0.1:6081/vnc.html 2>/dev/null; then
        (cd /opt/noVNC/utils && setsid ./novnc_proxy --vnc localhost:5901 --listen 6081 --web /opt/noVNC </dev/null >/tmp/space-novnc.log 2>&1 &)
        i=0
        until curl -fsS -m 2 -o /dev/null http://127.0.0.1:6081/vnc.html 2>/dev/null; do
            i=$((i + 1)); [ "$i" -gt 60 ] && break; sleep 1
        done
    fi
    echo headful
else
    echo headless
fi
"#;

/// What a start found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// Whether Chromium runs on a display (and the live view is there).
    pub headful: bool,
}

/// Starts the browser of a sandbox of the caller's (waking the sandbox), unless it runs.
pub async fn start(st: &Shared, who: &Principal, raw: &str) -> ApiResult<(SandboxId, Started)> {
    let id = super::sandboxes::scoped(st, who, raw, "browser.start").await?;
    let result = run_start(st, who, &id).await;
    st.audit(
        who,
        Some(id.as_str()),
        "browser.start",
        result.as_ref().err(),
        result
            .as_ref()
            .ok()
            .map(|s| if s.headful { "headful" } else { "headless" }.to_owned()),
    )
    .await;
    Ok((id, result?))
}

async fn run_start(st: &Shared, who: &Principal, id: &SandboxId) -> ApiResult<Started> {
    let guest = st.guest(Some(who), id).await?;
    let mut spec = space_proto::ExecSpec::shell(START);
    spec.username = Some("user".into());
    spec.timeout_ms = Some(START_TIMEOUT_MS);
    let handle = match st.guest_call(id, guest.exec(spec)).await {
        Ok(h) => h,
        // A template without the account the browser runs as (`minimal`) has no browser
        // either: the sandbox is there, it is the wrong kind.
        Err(e) if e.guest == Some(space_proto::ErrorKind::NotFound) => {
            return Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "illegal_state",
                format!(
                    "this sandbox's template has no browser (use template desktop): {}",
                    e.message
                ),
            ))
        }
        Err(e) => return Err(e),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(32);
    tokio::spawn(super::exec::pump_exec(
        handle,
        tx,
        super::exec::Origin(st.node.clone(), id.clone()),
    ));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut code = None;
    while let Some(o) = rx.recv().await {
        match o.event() {
            ExecEvent::Stdout { data } => out.extend_from_slice(&data),
            ExecEvent::Stderr { data } => err.extend_from_slice(&data),
            ExecEvent::Exit { exit_code, .. } => code = exit_code,
            ExecEvent::Error { code, message } => {
                return Err(ApiError::guest(format!(
                    "starting the browser: {message} ({code})"
                )))
            }
            ExecEvent::Started { .. } => {}
        }
    }
    let said = String::from_utf8_lossy(&out);
    match (code, said.lines().last().map(str::trim)) {
        (Some(0), Some("headful")) => Ok(Started { headful: true }),
        (Some(0), Some("headless")) => Ok(Started { headful: false }),
        (Some(3), _) => Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "illegal_state",
            String::from_utf8_lossy(&err).trim().to_owned(),
        )),
        _ => Err(ApiError::guest(format!(
            "the browser did not start (exit {code:?}): {}",
            String::from_utf8_lossy(&err[err.len().saturating_sub(2000)..]).trim()
        ))),
    }
}

/// Starts the browser of a sandbox of the caller's and answers its URLs on `base`
/// (`http(s)://host`, the server as the caller reached it).
pub async fn session(
    st: &Shared,
    who: &Principal,
    raw: &str,
    base: &str,
) -> ApiResult<space_api::BrowserSession> {
    let (id, started) = start(st, who, raw).await?;
    let ws_base = match base.strip_prefix("https://") {
        Some(rest) => format!("wss://{rest}"),
        None => format!("ws://{}", base.trim_start_matches("http://")),
    };
    let cdp = token(st, "cdp", &id);
    let live_url = started.headful.then(|| {
        let t = token(st, "live", &id);
        let prefix = format!("v1/sandboxes/{id}/browser/live/{t}");
        format!("{base}/{prefix}/vnc.html?autoconnect=true&resize=scale&path={prefix}/websockify")
    });
    let expires = SystemTime::now() + TOKEN_TTL;
    Ok(space_api::BrowserSession {
        cdp_url: format!("{ws_base}/v1/sandboxes/{id}/browser/cdp?token={cdp}"),
        live_url,
        headful: started.headful,
        expires_unix_ms: expires
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    })
}

/// The browser's DevTools WebSocket path now (`/devtools/browser/<id>`), from its
/// `/json/version`.
pub async fn devtools_path(
    st: &Shared,
    who: Option<&Principal>,
    id: &SandboxId,
) -> ApiResult<String> {
    let v = super::cdp::devtools_json(st, who, id, "/json/version").await?;
    // What the guest's browser says is hostile: only a path of the expected shape is used.
    let url = v["webSocketDebuggerUrl"].as_str().unwrap_or_default();
    let path = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(_, p)| format!("/{p}"))
        .unwrap_or_default();
    let id_part = path.strip_prefix("/devtools/browser/").unwrap_or_default();
    if !super::cdp::devtools_id(id_part) {
        return Err(ApiError::guest(
            "the browser's /json/version names no DevTools WebSocket",
        ));
    }
    Ok(path)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A token for `what` (`cdp` or `live`) of sandbox `id`, good for [`TOKEN_TTL`]:
/// `<expiry>.<hex MAC>`.
pub fn token(st: &Shared, what: &str, id: &SandboxId) -> String {
    let exp = now_secs() + TOKEN_TTL.as_secs();
    let mac = st
        .vault
        .mac(&format!("browser.{what}"), format!("{id}|{exp}").as_bytes());
    format!("{exp}.{}", hex::encode(mac))
}

/// Whether `token` is a live token for `what` of sandbox `id`.
pub fn check_token(st: &Shared, what: &str, id: &SandboxId, token: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    let Some((exp, mac)) = token.split_once('.') else {
        return false;
    };
    let Ok(exp_secs) = exp.parse::<u64>() else {
        return false;
    };
    if exp_secs < now_secs() || mac.len() != 64 {
        return false;
    }
    let want = hex::encode(
        st.vault
            .mac(&format!("browser.{what}"), format!("{id}|{exp}").as_bytes()),
    );
    bool::from(want.as_bytes().ct_eq(mac.as_bytes()))
}
