//! Where the CLI finds the server and its key.
//!
//! The URL and the key come from `SPACE_URL` / `SPACE_API_KEY`, else from the config file:
//! `$SPACE_CONFIG`, else `$XDG_CONFIG_HOME/space/config.json`, else
//! `~/.config/space/config.json`, holding `{"url": ..., "api_key": ...}`. `space up` writes
//! the same file on its first start.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The URL used when neither the environment nor the config file names one.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";

/// The largest config file read (it holds two short strings).
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The contents of the config file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConfigFile {
    /// The API base URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
}

/// What a client command connects with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The API base URL, without a trailing slash.
    pub url: String,
    /// The API key, if any was configured.
    pub api_key: Option<String>,
}

/// The config file path: `$SPACE_CONFIG`, `$XDG_CONFIG_HOME/space/config.json` or
/// `~/.config/space/config.json`.
pub fn config_path() -> Result<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = var("SPACE_CONFIG") {
        return Ok(PathBuf::from(p));
    }
    if let Some(x) = var("XDG_CONFIG_HOME") {
        return Ok(PathBuf::from(x).join("space").join("config.json"));
    }
    match var("HOME") {
        Some(h) => Ok(PathBuf::from(h)
            .join(".config")
            .join("space")
            .join("config.json")),
        None => bail!("neither SPACE_CONFIG, XDG_CONFIG_HOME nor HOME is set: no config file"),
    }
}

/// Reads the config file at `path`; a missing file is an empty config.
pub fn read(path: &Path) -> Result<ConfigFile> {
    use std::io::Read as _;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ConfigFile::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a valid config file (expected {{\"url\": ..., \"api_key\": ...}})",
            path.display()
        )
    })
}

/// Writes `config` to `path` with mode 0600, atomically (a temporary file renamed over it),
/// creating the parent directory.
pub fn write(path: &Path, config: &ConfigFile) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        let mut text = serde_json::to_vec_pretty(config)?;
        text.push(b'\n');
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The settings of a client command: environment first, then the config file.
pub fn load() -> Result<Settings> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (env_url, env_key) = (env("SPACE_URL"), env("SPACE_API_KEY"));
    let file = if env_url.is_some() && env_key.is_some() {
        ConfigFile::default()
    } else {
        read(&config_path()?)?
    };
    let url = env_url
        .or(file.url)
        .unwrap_or_else(|| DEFAULT_URL.to_owned());
    let url = url.trim_end_matches('/').to_owned();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("the server URL {url:?} must start with http:// or https://");
    }
    Ok(Settings {
        url,
        api_key: env_key.or(file.api_key),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_round_trips_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("space-config-test-{}", std::process::id()));
        let path = dir.join("nested").join("config.json");
        let config = ConfigFile {
            url: Some("http://127.0.0.1:1".into()),
            api_key: Some("space_k_secret".into()),
        };
        write(&path, &config).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        let back = read(&path).unwrap();
        let missing = read(&dir.join("missing.json")).unwrap();
        std::fs::write(&path, b"{not json").unwrap();
        let broken = read(&path);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(mode, 0o600);
        assert_eq!(back, config);
        assert_eq!(missing, ConfigFile::default());
        assert!(broken.is_err());
    }
}
