//! The Runtime trait and its QEMU implementation.
