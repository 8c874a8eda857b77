//! How the gateway turns a destination name into addresses: once per connection, and the
//! address it checks is the address it connects to, so a name whose answer changes between
//! the check and the connection (DNS rebinding) reaches nothing it was not allowed to.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;

/// Most addresses of one name the gateway looks at.
pub const MAX_ADDRESSES: usize = 16;

/// The future of one resolution.
pub type Resolution<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>>;

/// A name resolver. The system's ([`SystemResolver`]) serves every deployment; tests give
/// their own to play a DNS server whose answers change.
pub trait Resolve: Send + Sync + 'static {
    /// The addresses of `name` (a validated DNS name, never an IP literal) with `port`.
    fn resolve<'a>(&'a self, name: &'a str, port: u16) -> Resolution<'a>;
}

/// The host's resolver (`getaddrinfo` through tokio's blocking pool).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str, port: u16) -> Resolution<'a> {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((name, port))
                .await?
                .take(MAX_ADDRESSES)
                .collect())
        })
    }
}
