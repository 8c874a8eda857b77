//! The routes of one running process from other requests than the one that started it, and
//! the guest's accounts.

use bytes::Bytes;
use http::{Method, Request};

use super::{empty_body, full_body, ClientError, ExecHandle, GuestClient, Result};
use crate::query::encode_component;
use crate::routes::{self, ProcessAction};
use crate::types::{Account, Resize};

impl GuestClient {
    /// Attaches to the output of running process `pid`: from now on, as an exec's (the
    /// handle has no stdin; [`GuestClient::send_stdin`] feeds it).
    pub async fn attach(&self, pid: u32) -> Result<ExecHandle> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(self.uri(&routes::process_path(pid, ProcessAction::Attach)))
            .body(empty_body())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (frames, pid) = self.started(req).await?;
        Ok(ExecHandle {
            pid,
            stdin: None,
            frames,
            status: None,
        })
    }

    /// Writes `data` to the stdin (or terminal) of running process `pid`, then closes its
    /// stdin if `eof`.
    pub async fn send_stdin(&self, pid: u32, data: Bytes, eof: bool) -> Result<()> {
        let mut path = routes::process_path(pid, ProcessAction::Stdin);
        if eof {
            path.push_str("?eof=true");
        }
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.uri(&path))
            .header(http::header::CONTENT_TYPE, "application/octet-stream")
            .body(full_body(data))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let _ = self.send(req).await?;
        Ok(())
    }

    /// Resizes the terminal of running PTY process `pid`.
    pub async fn resize(&self, pid: u32, rows: u16, cols: u16) -> Result<()> {
        let _: serde_json::Value = self
            .post_json(
                &routes::process_path(pid, ProcessAction::Resize),
                &Resize { rows, cols },
            )
            .await?;
        Ok(())
    }

    /// The guest's account `name`.
    pub async fn account(&self, name: &str) -> Result<Account> {
        self.get_json(&format!("{}?name={}", routes::USER, encode_component(name)))
            .await
    }
}
