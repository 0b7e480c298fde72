//! One module per API area.

pub mod chat;
pub mod completions;
pub mod conversations;
pub mod documents;
pub mod info;
pub mod models;
pub mod settings;
