//! The CLI's client of the public API: [`space_api::client::Client`] with the key and URL of
//! the configuration.

use anyhow::{anyhow, Result};

pub use space_api::client::{seg, Client, WebSocket};
pub use space_api::Failure as ApiError;

use crate::config::Settings;

/// A client for `settings`; fails when no key is configured.
pub fn connect(settings: &Settings) -> Result<Client> {
    let key = settings.api_key.clone().ok_or_else(|| {
        let path = crate::config::config_path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "the config file".into());
        anyhow!(
            "no API key: set SPACE_API_KEY, or put it in {path} (`space up` writes it on its \
             first start)"
        )
    })?;
    Client::new(
        &settings.url,
        &key,
        concat!("space-cli/", env!("CARGO_PKG_VERSION")),
    )
}
