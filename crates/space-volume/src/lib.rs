//! A volume's file tree on the host: the safe operations on its directory ([`tree`]) and the
//! answer to one request of a guest's mount ([`serve`]). `docs/volumes.md` says how volumes
//! reach guests and the API.

pub mod serve;
pub mod tree;

pub use serve::serve;
pub use tree::{Change, Tree};
