//! Environments in waves: the configuration and the rewriting of manifests
//! are the core's; `push` commits, `standing` reads where a release stands.

pub use gitcanary_core::wave::*;

pub mod push;
pub mod standing;
