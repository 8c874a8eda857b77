//! Helpers several test binaries share. Each binary uses a part of them.
#![allow(dead_code)]

pub mod pki;
pub mod upstream;
