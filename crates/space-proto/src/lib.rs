//! The host <-> guest protocol.
