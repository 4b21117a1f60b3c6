//! Manifests as the core defines them, and reading them from a directory.

pub use gitcanary_core::manifest::*;

pub mod load;

pub use load::{SizeCheck, load_dir};
