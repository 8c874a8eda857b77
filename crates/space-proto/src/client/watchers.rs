//! Buffered watches: events kept in the guest until taken.

use http::{Method, Request};

use super::{empty_body, ClientError, GuestClient, Result};
use crate::routes;
use crate::types::{WatchEvent, WatcherCreated, WatcherEvents, WatcherRequest};

impl GuestClient {
    /// Starts a buffered watch of directory `path`; returns its id.
    pub async fn create_watcher(&self, path: &str, recursive: bool) -> Result<String> {
        let req = WatcherRequest {
            path: path.into(),
            recursive,
        };
        let created: WatcherCreated = self.post_json(routes::WATCHERS, &req).await?;
        Ok(created.id)
    }

    /// The events of watch `id` since the last call.
    pub async fn watcher_events(&self, id: &str) -> Result<Vec<WatchEvent>> {
        let path = format!("{}{}", routes::WATCHERS_PREFIX, encode(id)?);
        let got: WatcherEvents = self.get_json(&path).await?;
        Ok(got.events)
    }

    /// Ends watch `id`.
    pub async fn remove_watcher(&self, id: &str) -> Result<()> {
        let req = Request::builder()
            .method(Method::DELETE)
            .uri(self.uri(&format!("{}{}", routes::WATCHERS_PREFIX, encode(id)?)))
            .body(empty_body())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let _ = self.send(req).await?;
        Ok(())
    }
}

/// A watcher id as a path segment: letters and digits only.
fn encode(id: &str) -> Result<&str> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ClientError::Invalid(crate::error::ProtoError::invalid(
            format!("{id:?} is not a watcher id"),
        )));
    }
    Ok(id)
}
