//! Bounds the daemon enforces on everything the host sends. They live here so the client can
//! refuse an oversized request locally with the same numbers instead of learning it from a
//! round trip.

/// Largest JSON request or response body.
pub const MAX_JSON_BODY: usize = 1024 * 1024;
/// Processes (exec and PTY) that may run at once.
pub const MAX_PROCESSES: usize = 1024;
/// Arguments in one argv.
pub const MAX_ARGS: usize = 4096;
/// Total bytes of argv (or of a shell line).
pub const MAX_ARGV_BYTES: usize = 256 * 1024;
/// Environment variables in one request (after merging).
pub const MAX_ENV_VARS: usize = 4096;
/// Total bytes of environment keys and values in one request.
pub const MAX_ENV_BYTES: usize = 256 * 1024;
/// Longest path accepted (Linux PATH_MAX).
pub const MAX_PATH_LEN: usize = 4096;
/// Watch streams open at once.
pub const MAX_WATCH_STREAMS: usize = 64;
/// Directories one recursive watch may cover.
pub const MAX_WATCH_DIRS: usize = 8192;
/// Entropy bytes accepted by identity.
pub const MAX_ENTROPY: usize = 4096;
/// Entries returned by one directory listing.
pub const MAX_LIST_ENTRIES: usize = 100_000;
/// Longest hostname (Linux HOST_NAME_MAX).
pub const MAX_HOSTNAME: usize = 64;
/// Finished processes still reported by the process list.
pub const MAX_FINISHED_PROCESSES: usize = 128;
/// Largest CA certificate (PEM) accepted by identity.
pub const MAX_CA_PEM: usize = 64 * 1024;
/// Extended attributes one write may set, and that a stat reports.
pub const MAX_XATTRS: usize = 32;
/// Longest extended attribute name (Linux XATTR_NAME_MAX).
pub const MAX_XATTR_NAME: usize = 255;
/// Largest extended attribute value a write may set, and that a stat reports.
pub const MAX_XATTR_VALUE: usize = 4096;

/// Start of the `space.egress` synchronisation line (`docs/egress.md`); the token's hex
/// digits ([`EGRESS_SYNC_TOKEN_HEX`]) and `\n` follow.
pub const EGRESS_SYNC_PREFIX: &[u8] = b"SPACE-EGRESS/1 ";
/// Hex digits of the synchronisation line's token.
pub const EGRESS_SYNC_TOKEN_HEX: usize = 32;
/// Most bytes either end of `space.egress` discards while looking for the synchronisation line.
pub const EGRESS_MAX_DISCARD: usize = 1 << 20;
