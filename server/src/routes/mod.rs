//! One module per API area.

pub mod chat;
pub mod completions;
pub mod documents;
pub mod info;
