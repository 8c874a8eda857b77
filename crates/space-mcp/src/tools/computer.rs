//! Computer-use tools: a sandbox of the `desktop` template as a computer an agent sees and
//! drives: a screenshot (returned as an image), clicks, typing, keys, scrolling, and
//! navigating its browser. The first of them starts the desktop (Xvfb on `:0` and Xfce, as
//! user `user`) when none runs. Each action is one command in the guest (xdotool, scrot);
//! text, keys and URLs travel in the command's environment, never in its shell line.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use futures::StreamExt as _;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use space_api::{ExecEvent, ExecRequest};

use super::{args, Done, Result, Spec, ToolError};
use crate::api::{read_capped, Conn, Failure};

/// The display the desktop runs on.
const DISPLAY: &str = ":0";
/// The screen's size when this starts the desktop.
const SCREEN: &str = "1280x800x24";
/// The largest screenshot returned.
const MAX_SCREENSHOT: usize = 8 << 20;
/// The longest text `type_text` takes.
const MAX_TEXT: usize = 4096;

/// Starts Xvfb and Xfce as `user` unless a display answers; exit 3: no desktop in the image.
const DESKTOP_UP: &str = r#"if ! xdpyinfo -display :0 >/dev/null 2>&1; then
    command -v Xvfb >/dev/null 2>&1 || { echo "this sandbox has no desktop: create it from template desktop" >&2; exit 3; }
    runuser -u user -- setsid Xvfb :0 -ac -screen 0 "$SPACE_SCREEN" -nolisten tcp </dev/null >/tmp/space-xvfb.log 2>&1 &
    i=0
    until xdpyinfo -display :0 >/dev/null 2>&1; do
        i=$((i + 1)); [ "$i" -gt 120 ] && { echo "the display did not start" >&2; tail -n 5 /tmp/space-xvfb.log >&2; exit 4; }
        sleep 0.5
    done
    runuser -u user -- env DISPLAY=:0 HOME=/home/user setsid startxfce4 </dev/null >/tmp/space-xfce.log 2>&1 &
    i=0
    until pgrep -x xfwm4 >/dev/null 2>&1; do i=$((i + 1)); [ "$i" -gt 120 ] && break; sleep 0.5; done
fi
"#;

/// Arguments of screenshot.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenshotArgs {
    /// The sandbox's id (sbx-...); its template must be `desktop`.
    pub sandbox_id: String,
}

/// A mouse button.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Button {
    /// The left button.
    #[default]
    Left,
    /// The middle button.
    Middle,
    /// The right button.
    Right,
}

/// Arguments of click.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClickArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// Pixels from the left edge of the screen (as in the screenshot).
    pub x: u32,
    /// Pixels from the top edge.
    pub y: u32,
    /// `left` (the default), `middle` or `right`.
    #[serde(default)]
    pub button: Button,
    /// Click twice.
    #[serde(default)]
    pub double: bool,
}

/// Arguments of type_text.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TypeArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The text, typed where the keyboard focus is (at most 4096 characters).
    pub text: String,
}

/// Arguments of press_key.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// X key names joined by `+` for a chord, e.g. `Return`, `ctrl+l`, `alt+Tab`, `Escape`.
    pub keys: String,
}

/// Arguments of scroll.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScrollArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// `up` or `down`.
    pub direction: Direction,
    /// How many wheel steps (1 to 50; 3 when left out).
    #[serde(default)]
    pub amount: Option<u32>,
}

/// A scroll direction.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Up.
    Up,
    /// Down.
    Down,
}

/// Arguments of navigate.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NavigateArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The http(s) URL to open in the sandbox's browser.
    pub url: String,
}

macro_rules! computer_spec {
    ($name:literal, $title:literal, $args:ty, $ro:expr, $desc:expr) => {
        Spec {
            name: $name,
            title: $title,
            description: $desc,
            schema: super::schema::<$args>,
            read_only: $ro,
            destructive: false,
        }
    };
}

/// The computer-use tools.
pub const TOOLS: &[Spec] = &[
    computer_spec!(
        "screenshot",
        "Take a screenshot",
        ScreenshotArgs,
        true,
        "Take a screenshot of a desktop sandbox's screen (template `desktop`), returned as a \
         PNG image. Starts the desktop first when none runs. Coordinates for click are pixels \
         of this image."
    ),
    computer_spec!(
        "click",
        "Click",
        ClickArgs,
        false,
        "Move the mouse to (x, y) on a desktop sandbox's screen and click (left by default; \
         double for a double click)."
    ),
    computer_spec!(
        "type_text",
        "Type text",
        TypeArgs,
        false,
        "Type text on a desktop sandbox's keyboard, where the focus is (click a field first)."
    ),
    computer_spec!(
        "press_key",
        "Press keys",
        KeyArgs,
        false,
        "Press a key or a chord on a desktop sandbox's keyboard: X key names joined by `+`, \
         e.g. `Return`, `ctrl+l`, `alt+Tab`."
    ),
    computer_spec!(
        "scroll",
        "Scroll",
        ScrollArgs,
        false,
        "Scroll a desktop sandbox's screen up or down where the mouse is, by wheel steps."
    ),
    computer_spec!(
        "navigate",
        "Open a URL in the browser",
        NavigateArgs,
        false,
        "Open a URL in a desktop sandbox's browser (Chromium, started on the desktop when it \
         does not run). Its profile lives on the sandbox's disk: logins stay. Take a \
         screenshot to see the page."
    ),
];

/// Runs a shell line in the guest with `env`, the display up first; answers stdout, or the
/// failure with stderr.
async fn run(conn: &Conn, id: &str, line: &str, env: BTreeMap<String, String>) -> Result<String> {
    let mut env = env;
    env.insert("DISPLAY".into(), DISPLAY.into());
    env.insert("SPACE_SCREEN".into(), SCREEN.into());
    let req = ExecRequest {
        shell: Some(format!("{DESKTOP_UP}{line}")),
        env,
        timeout_ms: Some(120_000),
        ..ExecRequest::default()
    };
    let mut events = conn.ops.exec(&conn.who, id, &req).await?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(ev) = events.next().await {
        match ev? {
            ExecEvent::Stdout { data } => out.extend_from_slice(&data),
            ExecEvent::Stderr { data } => err.extend_from_slice(&data),
            ExecEvent::Exit { exit_code, signal } => {
                let err = String::from_utf8_lossy(&err).trim().to_owned();
                return match (exit_code, signal) {
                    (Some(0), _) => Ok(String::from_utf8_lossy(&out).into_owned()),
                    (Some(3), _) => Err(ToolError(format!("{err} [illegal_state]."))),
                    _ => Err(ToolError(format!(
                        "the action failed (exit {exit_code:?}, signal {signal:?}): {err}"
                    ))),
                };
            }
            ExecEvent::Error { code, message } => return Err(Failure::new(0, code, message).into()),
            ExecEvent::Started { .. } => {}
        }
    }
    Err(ToolError(
        "the action's command ended without an exit status".into(),
    ))
}

fn done(text: String) -> Done {
    Done {
        data: json!({ "done": text }),
        text,
        image: None,
    }
}

/// Checks X key names joined by `+`.
fn check_keys(keys: &str) -> Result<()> {
    let ok = !keys.is_empty()
        && keys.len() <= 64
        && keys
            .split('+')
            .all(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    if ok {
        Ok(())
    } else {
        Err(ToolError(format!(
            "keys {keys:?} are not X key names joined by + (like Return, ctrl+l, alt+Tab)"
        )))
    }
}

/// Calls computer tool `name`, or answers `None` when `name` is not one.
pub async fn call(conn: &Conn, name: &str, raw: serde_json::Value) -> Option<Result<Done>> {
    Some(match name {
        "screenshot" => match args::<ScreenshotArgs>(name, raw) {
            Ok(a) => screenshot(conn, a).await,
            Err(e) => Err(e),
        },
        "click" => match args::<ClickArgs>(name, raw) {
            Ok(a) => {
                let button = match a.button {
                    Button::Left => 1,
                    Button::Middle => 2,
                    Button::Right => 3,
                };
                let repeat = if a.double { 2 } else { 1 };
                let line = format!(
                    "xdotool mousemove --sync {} {} click --repeat {repeat} {button}",
                    a.x, a.y
                );
                run(conn, &a.sandbox_id, &line, BTreeMap::new())
                    .await
                    .map(|_| done(format!("clicked at ({}, {})", a.x, a.y)))
            }
            Err(e) => Err(e),
        },
        "type_text" => match args::<TypeArgs>(name, raw) {
            Ok(a) if a.text.chars().count() > MAX_TEXT => Err(ToolError(format!(
                "text is over {MAX_TEXT} characters: type it in parts"
            ))),
            Ok(a) => {
                let env = BTreeMap::from([("SPACE_TEXT".to_owned(), a.text.clone())]);
                run(
                    conn,
                    &a.sandbox_id,
                    "xdotool type --delay 20 -- \"$SPACE_TEXT\"",
                    env,
                )
                .await
                .map(|_| done(format!("typed {} characters", a.text.chars().count())))
            }
            Err(e) => Err(e),
        },
        "press_key" => match args::<KeyArgs>(name, raw) {
            Ok(a) => match check_keys(&a.keys) {
                Ok(()) => {
                    let env = BTreeMap::from([("SPACE_KEYS".to_owned(), a.keys.clone())]);
                    run(conn, &a.sandbox_id, "xdotool key -- \"$SPACE_KEYS\"", env)
                        .await
                        .map(|_| done(format!("pressed {}", a.keys)))
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
        "scroll" => match args::<ScrollArgs>(name, raw) {
            Ok(a) => {
                let amount = a.amount.unwrap_or(3).clamp(1, 50);
                let wheel = if a.direction == Direction::Up { 4 } else { 5 };
                let line = format!("xdotool click --repeat {amount} {wheel}");
                run(conn, &a.sandbox_id, &line, BTreeMap::new())
                    .await
                    .map(|_| done(format!("scrolled {amount} steps")))
            }
            Err(e) => Err(e),
        },
        "navigate" => match args::<NavigateArgs>(name, raw) {
            Ok(a) => navigate(conn, a).await,
            Err(e) => Err(e),
        },
        _ => return None,
    })
}

async fn screenshot(conn: &Conn, a: ScreenshotArgs) -> Result<Done> {
    let path = "/tmp/space-screenshot.png";
    let size = run(
        conn,
        &a.sandbox_id,
        &format!(
            "scrot --overwrite --pointer {path} && xdpyinfo -display :0 | sed -n 's/^ *dimensions: *\\([0-9]*x[0-9]*\\).*/\\1/p'"
        ),
        BTreeMap::new(),
    )
    .await?;
    let body = conn.ops.read_file(&conn.who, &a.sandbox_id, path).await?;
    let (png, total) = read_capped(body, MAX_SCREENSHOT).await;
    if total > MAX_SCREENSHOT as u64 || !png.starts_with(b"\x89PNG") {
        return Err(ToolError(
            "the screenshot is not a PNG of a sane size".into(),
        ));
    }
    let size = size.trim().to_owned();
    Ok(Done {
        text: format!(
            "screenshot of the {size} screen ({} bytes of PNG)",
            png.len()
        ),
        data: json!({ "size": size, "bytes": png.len() }),
        image: Some((B64.encode(&png), "image/png")),
    })
}

async fn navigate(conn: &Conn, a: NavigateArgs) -> Result<Done> {
    let url = a.url.trim();
    if !(url.starts_with("http://") || url.starts_with("https://"))
        || url.len() > 2048
        || url.chars().any(char::is_control)
    {
        return Err(ToolError(format!(
            "{url:?} is not an http(s) URL of at most 2048 characters"
        )));
    }
    // The desktop first (the browser starts on its display), then the browser.
    run(conn, &a.sandbox_id, "true", BTreeMap::new()).await?;
    conn.ops.browser(&conn.who, &a.sandbox_id).await?;
    let env = BTreeMap::from([("SPACE_URL".to_owned(), url.to_owned())]);
    // The DevTools port answers before the first window is mapped: wait for it a little.
    let line = "i=0; until w=$(xdotool search --onlyvisible --class chromium | tail -n 1); \
                [ -n \"$w\" ]; do i=$((i + 1)); \
                [ \"$i\" -gt 60 ] && { echo 'no browser window on the display' >&2; exit 5; }; \
                sleep 0.5; done; \
                xdotool windowactivate --sync \"$w\" key --clearmodifiers ctrl+l && \
                xdotool type --delay 10 -- \"$SPACE_URL\" && xdotool key Return";
    run(conn, &a.sandbox_id, line, env).await?;
    Ok(done(format!("opened {url}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_names_joined_by_plus() {
        assert!(check_keys("Return").is_ok());
        assert!(check_keys("ctrl+shift+t").is_ok());
        assert!(check_keys("").is_err());
        assert!(check_keys("ctrl+").is_err());
        assert!(check_keys("a;rm -rf /").is_err());
    }

    #[test]
    fn arguments_are_checked() {
        let e = args::<ClickArgs>("click", json!({"sandbox_id": "s", "x": -1, "y": 2}));
        assert!(e.is_err());
        let a: ClickArgs = args(
            "click",
            json!({"sandbox_id": "s", "x": 1, "y": 2, "button": "right"}),
        )
        .unwrap();
        assert_eq!(a.button, Button::Right);
    }
}
