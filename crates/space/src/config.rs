//! Where the CLI finds the server and its key.
//!
//! The URL and the key come from `SPACE_URL` / `SPACE_API_KEY`, else from the config file:
//! `$SPACE_CONFIG`, else `$XDG_CONFIG_HOME/space/config.json`, else
//! `~/.config/space/config.json`, holding `{"url": ..., "api_key": ...}` (the `default`
//! profile) and, for other deployments, `"profiles": {"NAME": {"url", "api_key"}}` with
//! `"current": NAME` naming the one used when no `--profile` (or `SPACE_PROFILE`) is given.
//! `space up` writes its deployment's profile there; it makes it the current one only when
//! there is no other yet, so starting a second deployment never takes the CLI away from the
//! first.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The URL used when neither the environment nor the config file names one.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";

/// The largest config file read (it holds two short strings).
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The name of the profile the top-level `url` and `api_key` are.
pub const DEFAULT_PROFILE: &str = "default";

/// The contents of the config file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConfigFile {
    /// The API base URL of the `default` profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The API key of the `default` profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The profile used when none is named (`default` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// The other profiles, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, Profile>,
}

/// One deployment the CLI talks to.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Profile {
    /// The API base URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
}

/// Whether `name` can be a profile name: 1 to 64 of `[A-Za-z0-9._-]`.
pub fn is_profile_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl ConfigFile {
    /// The profile `name` (`default`: the top-level fields).
    pub fn profile(&self, name: &str) -> Option<Profile> {
        if name == DEFAULT_PROFILE {
            return Some(Profile {
                url: self.url.clone(),
                api_key: self.api_key.clone(),
            });
        }
        self.profiles.get(name).cloned()
    }

    /// Sets profile `name`, keeping a key it already has when `profile` has none.
    pub fn set_profile(&mut self, name: &str, profile: Profile) {
        if name == DEFAULT_PROFILE {
            self.url = profile.url.or(self.url.take());
            self.api_key = profile.api_key.or(self.api_key.take());
        } else {
            let slot = self.profiles.entry(name.to_owned()).or_default();
            slot.url = profile.url.or(slot.url.take());
            slot.api_key = profile.api_key.or(slot.api_key.take());
        }
    }

    /// Whether any profile is configured.
    pub fn is_empty(&self) -> bool {
        self.url.is_none() && self.api_key.is_none() && self.profiles.is_empty()
    }

    /// The names of every profile.
    pub fn names(&self) -> Vec<String> {
        let mut names = Vec::new();
        if self.url.is_some() || self.api_key.is_some() {
            names.push(DEFAULT_PROFILE.to_owned());
        }
        names.extend(self.profiles.keys().cloned());
        names
    }
}

/// The profile named by `--profile` or `SPACE_PROFILE`, if any (set by `main`).
static CHOSEN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Records the `--profile` flag (before any settings are loaded).
pub fn choose_profile(flag: Option<String>) {
    let chosen = flag.or_else(|| {
        std::env::var("SPACE_PROFILE")
            .ok()
            .filter(|v| !v.is_empty())
    });
    let _ = CHOSEN.set(chosen);
}

/// The profile explicitly chosen, if any.
pub fn chosen_profile() -> Option<String> {
    CHOSEN.get().cloned().flatten()
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
    let name = chosen_profile()
        .or_else(|| file.current.clone())
        .unwrap_or_else(|| DEFAULT_PROFILE.to_owned());
    let profile = match file.profile(&name) {
        Some(p) => p,
        None if env_url.is_some() && env_key.is_some() => Profile::default(),
        None => bail!(
            "no profile {name:?} in {} (profiles: {})",
            config_path()?.display(),
            match file.names() {
                n if n.is_empty() => "none".to_owned(),
                n => n.join(", "),
            }
        ),
    };
    let url = env_url
        .or(profile.url)
        .unwrap_or_else(|| DEFAULT_URL.to_owned());
    let url = url.trim_end_matches('/').to_owned();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("the server URL {url:?} must start with http:// or https://");
    }
    Ok(Settings {
        url,
        api_key: env_key.or(profile.api_key),
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
        let mut config = ConfigFile {
            url: Some("http://127.0.0.1:1".into()),
            api_key: Some("space_k_secret".into()),
            ..Default::default()
        };
        config.set_profile(
            "staging",
            Profile {
                url: Some("http://127.0.0.1:2".into()),
                api_key: Some("space_k_other".into()),
            },
        );
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

    #[test]
    fn profiles_keep_their_keys_and_the_default_is_the_top_level() {
        let mut c = ConfigFile::default();
        assert!(c.is_empty() && c.names().is_empty());
        c.set_profile(
            "default",
            Profile {
                url: Some("http://a".into()),
                api_key: Some("ka".into()),
            },
        );
        c.set_profile(
            "b",
            Profile {
                url: Some("http://b".into()),
                api_key: Some("kb".into()),
            },
        );
        // A later start gives the URL only: the key stays.
        c.set_profile(
            "b",
            Profile {
                url: Some("http://b2".into()),
                api_key: None,
            },
        );
        assert_eq!(c.url.as_deref(), Some("http://a"));
        let b = c.profile("b").unwrap();
        assert_eq!(
            (b.url.as_deref(), b.api_key.as_deref()),
            (Some("http://b2"), Some("kb"))
        );
        assert_eq!(c.names(), ["default", "b"]);
        assert!(c.profile("c").is_none());
        assert!(is_profile_name("var-tmp-d1") && !is_profile_name("a/b") && !is_profile_name(""));
    }
}
