//! Pulling an image from a registry that speaks the OCI distribution API.
//!
//! A reference is `[host[:port]/]repository[:tag][@sha256:…]` (`docker.io` and `library/`
//! when the host is left out, as docker does). The manifest is fetched (an index picks
//! `linux/amd64`) and every blob is downloaded into a content-addressed directory, checked
//! against its digest while it streams, never more bytes than its descriptor says: a second
//! pull of an image finds its blobs there. The image is then applied from those files.
//!
//! Authentication: anonymous, HTTP basic, and the bearer-token flow registries answer a `401`
//! with (`WWW-Authenticate: Bearer realm=…,service=…,scope=…`, the credentials sent to the
//! realm when there are any). The pulled image is pinned: [`PulledImage::manifest_digest`]
//! names exactly what was applied, and a reference with a digest is refused if the registry
//! answers other bytes.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use futures::StreamExt;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;

use crate::archive::{apply_checked, Check};
use crate::layers::{Budget, Compression, LayerStats};
use crate::spec::{self, Descriptor, Digest, ImageConfig, Index, Manifest, MAX_DOCUMENT};
use crate::{ImageError, Result};

/// The registry of references without a host.
const DEFAULT_REGISTRY: &str = "docker.io";
/// Where `docker.io` is served.
const DOCKER_HUB: &str = "registry-1.docker.io";

const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

fn invalid(msg: impl Into<String>) -> ImageError {
    ImageError::Invalid(msg.into())
}

/// An image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`.
    pub registry: String,
    /// `path/name`.
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

fn is_repo_component(c: &str) -> bool {
    // Lowercase alphanumerics separated by one `.`, `_`, `__` or any number of `-`.
    let b = c.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return false;
    }
    c.bytes()
        .all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || matches!(x, b'.' | b'_' | b'-'))
        && !c.contains("..")
        && !c.contains("___")
}

fn is_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && t.bytes()
            .all(|x| x.is_ascii_alphanumeric() || matches!(x, b'_' | b'.' | b'-'))
}

impl Reference {
    /// Parses a reference; an image without tag or digest is `:latest`.
    pub fn parse(s: &str) -> Result<Reference> {
        let bad = |why: &str| invalid(format!("the image reference {s:?} {why}"));
        if s.is_empty() || s.len() > 1024 {
            return Err(bad("is empty or too long"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (
                r,
                Some(Digest::parse(d).map_err(|_| bad("has a bad digest"))?),
            ),
            None => (s, None),
        };
        // A tag follows the last `:` after the last `/` (a `:` before it is a port).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (
                &rest[..last_slash + i],
                Some(rest[last_slash + i + 1..].to_owned()),
            ),
            None => (rest, None),
        };
        if let Some(t) = &tag {
            if !is_tag(t) {
                return Err(bad("has a bad tag"));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((host, repo))
                if host.contains('.') || host.contains(':') || host == "localhost" =>
            {
                (host.to_owned(), repo.to_owned())
            }
            _ => (DEFAULT_REGISTRY.to_owned(), name.to_owned()),
        };
        let repository = if registry == DEFAULT_REGISTRY && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if !repository.split('/').all(is_repo_component) {
            return Err(bad(
                "has a bad repository name (lowercase letters, digits, . _ -)",
            ));
        }
        if registry
            .bytes()
            .any(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')))
        {
            return Err(bad("has a bad registry host"));
        }
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".to_owned())
        } else {
            tag
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The manifest to ask for: the digest when pinned, else the tag.
    fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// Credentials for a registry.
#[derive(Clone, Default)]
pub enum Auth {
    #[default]
    Anonymous,
    Basic {
        user: String,
        password: String,
    },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Anonymous => f.write_str("Anonymous"),
            Auth::Basic { user, .. } => write!(f, "Basic({user}, <password>)"),
        }
    }
}

/// A `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

fn parse_challenge(header: &str) -> Option<Challenge> {
    let (scheme, params) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut realm = None;
    let mut service = None;
    let mut scope = None;
    // key="value" pairs separated by commas; values may hold commas inside quotes.
    let mut rest = params.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (value, tail) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], &q[end + 1..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        match key.trim().to_ascii_lowercase().as_str() {
            "realm" => realm = Some(value.to_owned()),
            "service" => service = Some(value.to_owned()),
            "scope" => scope = Some(value.to_owned()),
            _ => {}
        }
        rest = tail.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge::Bearer {
        realm: realm?,
        service,
        scope,
    })
}

/// A registry client for one reference's repository.
pub struct Registry {
    http: reqwest::Client,
    base: String,
    reference: Reference,
    auth: Auth,
    /// The `Authorization` header that works, once known.
    authorization: Mutex<Option<String>>,
}

/// An image pulled into a blob directory, its documents checked, ready to apply.
#[derive(Debug)]
pub struct PulledImage {
    pub reference: Reference,
    /// The digest of the manifest applied: the pin.
    pub manifest_digest: Digest,
    pub config: ImageConfig,
    pub config_digest: Digest,
    layers: Vec<(PathBuf, Descriptor)>,
}

impl Registry {
    /// A client for `reference`'s registry; `plain_http` speaks HTTP instead of HTTPS (a
    /// registry on loopback or a private network).
    pub fn new(reference: &Reference, auth: Auth, plain_http: bool) -> Result<Registry> {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| invalid(format!("the HTTP client: {e}")))?;
        let host = if reference.registry == DEFAULT_REGISTRY {
            DOCKER_HUB
        } else {
            &reference.registry
        };
        let scheme = if plain_http { "http" } else { "https" };
        Ok(Registry {
            http,
            base: format!("{scheme}://{host}/v2/{}", reference.repository),
            reference: reference.clone(),
            auth,
            authorization: Mutex::new(None),
        })
    }

    fn current_authorization(&self) -> Option<String> {
        self.authorization
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Answers a 401's challenge: the `Authorization` header to send from now on.
    async fn authorize(&self, challenge: Option<Challenge>) -> Result<String> {
        let basic = match &self.auth {
            Auth::Basic { user, password } => Some((user.clone(), password.clone())),
            Auth::Anonymous => None,
        };
        match challenge {
            Some(Challenge::Basic) | None => {
                let Some((user, password)) = basic else {
                    return Err(invalid(format!(
                        "the registry {} wants credentials",
                        self.reference.registry
                    )));
                };
                use base64::Engine;
                let token =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                Ok(format!("Basic {token}"))
            }
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let scope = scope
                    .unwrap_or_else(|| format!("repository:{}:pull", self.reference.repository));
                let mut req = self.http.get(&realm).query(&[("scope", scope.as_str())]);
                if let Some(s) = &service {
                    req = req.query(&[("service", s.as_str())]);
                }
                if let Some((user, password)) = &basic {
                    req = req.basic_auth(user, Some(password));
                }
                let resp = req
                    .send()
                    .await
                    .map_err(|e| invalid(format!("the registry's token service {realm}: {e}")))?;
                if resp.status() == reqwest::StatusCode::UNAUTHORIZED
                    || resp.status() == reqwest::StatusCode::FORBIDDEN
                {
                    return Err(invalid(format!(
                        "the registry {} refused the credentials ({})",
                        self.reference.registry,
                        resp.status()
                    )));
                }
                if !resp.status().is_success() {
                    return Err(invalid(format!(
                        "the registry's token service answered {}",
                        resp.status()
                    )));
                }
                let body = read_bounded(resp, 64 << 10, "the token").await?;
                let v: serde_json::Value = serde_json::from_slice(&body)
                    .map_err(|e| invalid(format!("the registry's token is not JSON: {e}")))?;
                let token = v["token"]
                    .as_str()
                    .or(v["access_token"].as_str())
                    .ok_or_else(|| invalid("the registry's token service answered no token"))?;
                Ok(format!("Bearer {token}"))
            }
        }
    }

    /// GET `path` (under the repository), authorizing once on a 401.
    async fn get(&self, path: &str, accept: Option<&str>) -> Result<reqwest::Response> {
        let url = format!("{}/{path}", self.base);
        for attempt in 0..2 {
            let mut req = self.http.get(&url);
            if let Some(a) = accept {
                req = req.header(reqwest::header::ACCEPT, a);
            }
            if let Some(auth) = self.current_authorization() {
                req = req.header(reqwest::header::AUTHORIZATION, auth);
            }
            let resp = req.send().await.map_err(|e| {
                invalid(format!(
                    "the registry {} cannot be reached: {e}",
                    self.reference.registry
                ))
            })?;
            if resp.status() != reqwest::StatusCode::UNAUTHORIZED {
                return Ok(resp);
            }
            if attempt == 1 || self.current_authorization().is_some() {
                return Err(invalid(format!(
                    "the registry {} refused the credentials (401)",
                    self.reference.registry
                )));
            }
            let challenge = resp
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_challenge);
            let auth = self.authorize(challenge).await?;
            *self.authorization.lock().unwrap_or_else(|p| p.into_inner()) = Some(auth);
        }
        unreachable!("the loop returns")
    }

    /// A manifest or index by tag or digest: its bytes and media type, checked against the
    /// digest when one was asked for.
    async fn document(&self, reference: &str) -> Result<(Vec<u8>, String, Digest)> {
        let resp = self
            .get(&format!("manifests/{reference}"), Some(ACCEPT))
            .await?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(invalid(format!(
                "the registry has no image {}",
                self.reference
            )));
        }
        if !status.is_success() {
            return Err(invalid(format!(
                "the registry answered {status} for the manifest of {}",
                self.reference
            )));
        }
        let media = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        let bytes = read_bounded(resp, MAX_DOCUMENT, "the manifest").await?;
        let digest = Digest::of(&bytes);
        if let Ok(want) = Digest::parse(reference) {
            want.verify(&bytes, "the manifest")?;
        }
        // A manifest without a media type header says it in its body.
        let media = if media.is_empty() || media == "application/json" {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v["mediaType"].as_str().map(str::to_owned))
                .unwrap_or(media)
        } else {
            media
        };
        Ok((bytes, media, digest))
    }

    /// Downloads a blob into `blobs/sha256/<hex>` under `dir` (kept there for the next pull),
    /// checked against `desc` while it streams.
    async fn blob(&self, desc: &Descriptor, dir: &Path, budget: &mut Budget) -> Result<PathBuf> {
        let path = dir.join("blobs/sha256").join(desc.digest.hex());
        if tokio::fs::metadata(&path)
            .await
            .is_ok_and(|m| m.len() == desc.size)
        {
            return Ok(path);
        }
        if desc.size > budget.bytes {
            return Err(invalid(format!(
                "the blob {} is {} bytes, more than a template may hold",
                desc.digest, desc.size
            )));
        }
        let parent = path.parent().expect("a blob path has a parent");
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| ImageError::io(format!("mkdir {}", parent.display()), e))?;
        let resp = self.get(&format!("blobs/{}", desc.digest), None).await?;
        if !resp.status().is_success() {
            return Err(invalid(format!(
                "the registry answered {} for the blob {}",
                resp.status(),
                desc.digest
            )));
        }
        let tmp = parent.join(format!(
            ".{}.part-{}",
            desc.digest.hex(),
            std::process::id()
        ));
        let mut file = tokio::fs::File::create(&tmp)
            .await
            .map_err(|e| ImageError::io(format!("create {}", tmp.display()), e))?;
        let mut hash = Sha256::new();
        let mut got = 0u64;
        let mut stream = resp.bytes_stream();
        let result = async {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| {
                    invalid(format!("the download of {} broke off: {e}", desc.digest))
                })?;
                got += chunk.len() as u64;
                if got > desc.size {
                    return Err(invalid(format!(
                        "the blob {} is longer than the {} bytes its manifest says",
                        desc.digest, desc.size
                    )));
                }
                hash.update(&chunk);
                file.write_all(&chunk)
                    .await
                    .map_err(|e| ImageError::io(format!("write {}", tmp.display()), e))?;
            }
            file.flush()
                .await
                .map_err(|e| ImageError::io(format!("write {}", tmp.display()), e))?;
            if got != desc.size {
                return Err(invalid(format!(
                    "the blob {} is {got} bytes, not the {} its manifest says",
                    desc.digest, desc.size
                )));
            }
            let digest = format!("sha256:{}", hex::encode(hash.finalize_reset()));
            if digest != desc.digest.as_str() {
                return Err(invalid(format!(
                    "the blob {} does not match its digest (got {digest})",
                    desc.digest
                )));
            }
            tokio::fs::rename(&tmp, &path)
                .await
                .map_err(|e| ImageError::io(format!("rename {}", tmp.display()), e))
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        result?;
        budget.bytes -= desc.size;
        Ok(path)
    }

    /// Pulls the image: its documents checked, its blobs downloaded into `dir`.
    pub async fn pull(&self, dir: &Path, budget: &mut Budget) -> Result<PulledImage> {
        let (mut bytes, mut media, mut digest) =
            self.document(&self.reference.manifest_ref()).await?;
        if spec::is_index(&media) {
            let index: Index = spec::parse(&bytes, "image index")?;
            let picked = spec::pick_amd64(&index)?.clone();
            (bytes, media, digest) = self.document(picked.digest.as_str()).await?;
            picked.digest.verify(&bytes, "the manifest")?;
        }
        if !spec::is_manifest(&media) {
            return Err(invalid(format!(
                "the registry answered a {media:?} for {}, not an image manifest",
                self.reference
            )));
        }
        let manifest: Manifest = spec::parse(&bytes, "manifest")?;
        manifest.validate()?;
        let config_path = self.blob(&manifest.config, dir, budget).await?;
        let config_bytes = tokio::fs::read(&config_path)
            .await
            .map_err(|e| ImageError::io(format!("read {}", config_path.display()), e))?;
        let config: ImageConfig = spec::parse(&config_bytes, "image config")?;
        config.check_platform()?;
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for l in &manifest.layers {
            layers.push((self.blob(l, dir, budget).await?, l.clone()));
        }
        Ok(PulledImage {
            reference: self.reference.clone(),
            manifest_digest: digest,
            config,
            config_digest: manifest.config.digest.clone(),
            layers,
        })
    }
}

async fn read_bounded(resp: reqwest::Response, limit: usize, what: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| invalid(format!("{what} broke off: {e}")))?;
        if out.len() + chunk.len() > limit {
            return Err(invalid(format!("{what} is larger than {limit} bytes")));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

impl PulledImage {
    /// Layers of the image.
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Applies every layer, in order, onto `root`, each checked against its digest again as
    /// it is read from the blob directory.
    pub fn apply(&self, root: &Path, budget: &mut Budget) -> Result<Vec<LayerStats>> {
        let mut out = Vec::with_capacity(self.layers.len());
        for (path, desc) in &self.layers {
            let open = || {
                std::fs::File::open(path)
                    .map_err(|e| ImageError::io(format!("open {}", path.display()), e))
            };
            out.push(apply_checked(
                open,
                desc.digest.as_str(),
                Compression::from_media_type(&desc.media_type),
                &Check::Stored(desc.digest.clone()),
                root,
                budget,
            )?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_as_docker_reads_them() {
        let r = Reference::parse("python:3.12-slim").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("docker.io", "library/python", Some("3.12-slim"))
        );
        let r = Reference::parse("127.0.0.1:5000/team/tool").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "team/tool", Some("latest"))
        );
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("localhost/x/y:1.0@{d}")).unwrap();
        assert_eq!(
            (r.tag.as_deref(), r.digest.as_ref().map(Digest::as_str)),
            (Some("1.0"), Some(d.as_str()))
        );
        assert_eq!(r.manifest_ref(), d);
        assert_eq!(r.to_string(), format!("localhost/x/y:1.0@{d}"));
        for bad in [
            "",
            "Upper/Case",
            "a/../b",
            "x:bad tag",
            "x@sha256:short",
            "host:5000/repo:",
            "repo/-leading",
            "a b",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn challenges_are_read() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(parse_challenge(r#"Bearer service="x""#), None);
    }
}
