//! The web console (`docs/console.md`): its page at `/` and its files under `/console/`,
//! embedded in the binary when it is built (`build.rs`). The page calls the API with the key
//! a person typed in, like any client; this module only serves files.
//!
//! Every answer carries a content security policy that lets the page run its own files and
//! nothing else (no inline script, no frames, connections to this origin only), and is never
//! sniffed into another type.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One embedded file.
pub struct Asset {
    /// Under `/console/`.
    pub path: &'static str,
    /// Its `Content-Type`.
    pub mime: &'static str,
    /// Its entity tag (a hash of the bytes, quoted).
    pub tag: &'static str,
    pub bytes: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/console_assets.rs"));

/// The policy of the console's own pages: its scripts, styles and connections only.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self' data: blob:; font-src 'self'; connect-src 'self'; frame-src 'none'; \
    worker-src 'self' blob:; object-src 'none'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The embedded file at `path` (under `/console/`).
pub fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

/// Whether the vendored libraries were embedded (`scripts/console.sh` ran before the build).
pub fn has_vendored_libraries() -> bool {
    asset("vendor/xterm/xterm.mjs").is_some() && asset("vendor/novnc/core/rfb.js").is_some()
}

fn answer(a: &'static Asset, request: &HeaderMap) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.mime));
    headers.insert(header::ETAG, HeaderValue::from_static(a.tag));
    // Revalidated on every load (a 304 is a few bytes), so a new binary's files are used at once.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == a.tag));
    if fresh {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    (StatusCode::OK, headers, a.bytes).into_response()
}

fn missing(what: &str) -> Response {
    crate::error::ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("the console has no file {what}"),
    )
    .into_response()
}

/// `GET /`: the console's page.
pub async fn page(request: HeaderMap) -> Response {
    match asset("index.html") {
        Some(a) => answer(a, &request),
        None => missing("index.html (console/ was not there when this binary was built)"),
    }
}

/// `GET /console/{*path}`: one of its files.
pub async fn file(Path(path): Path<String>, request: HeaderMap) -> Response {
    match asset(&path) {
        Some(a) => answer(a, &request),
        None => missing(&format!("{:?}", path.chars().take(200).collect::<String>())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_files_are_embedded_with_their_types() {
        let page = asset("index.html").expect("console/index.html is embedded");
        assert!(page.mime.starts_with("text/html"));
        let text = std::str::from_utf8(page.bytes).unwrap();
        // The policy allows no inline script, so the page has none.
        assert!(!text.contains("<script>"), "an inline script");
        assert!(!text.to_ascii_lowercase().contains(" onload="));
        for a in ASSETS {
            assert!(a.tag.starts_with('"') && a.tag.ends_with('"'), "{}", a.path);
            assert!(
                !a.path.starts_with('/') && !a.path.contains(".."),
                "{}",
                a.path
            );
            if a.path.ends_with(".js") || a.path.ends_with(".mjs") {
                assert!(a.mime.starts_with("text/javascript"), "{}", a.path);
            }
        }
    }

    #[tokio::test]
    async fn files_answer_with_the_policy_and_revalidate() {
        let a = asset("index.html").unwrap();
        let r = file(Path("index.html".into()), HeaderMap::new()).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_SECURITY_POLICY], CSP);
        assert_eq!(r.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(r.headers()[header::ETAG], a.tag);
        let mut again = HeaderMap::new();
        again.insert(header::IF_NONE_MATCH, HeaderValue::from_static(a.tag));
        let r = page(again).await;
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
        let r = file(Path("../Cargo.toml".into()), HeaderMap::new()).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let r = file(Path("vendor/package.json".into()), HeaderMap::new()).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
}
