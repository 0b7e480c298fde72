//! Documents for Hillside: files of any supported format read into text a model can take and a
//! reader can cite (pages of a PDF, headings elsewhere), and the library that keeps them.

pub mod chunks;
pub mod ingest;
pub mod kv_cache;
pub mod library;
pub mod prompt;
pub mod questions;
pub mod service;
pub mod sources;
pub mod store_error;
pub mod summarize;

pub use ingest::{read_bytes, read_file, Document, Format, IngestError, Limits, Locator, Part};
pub use library::{Entry, Library};
pub use service::{DocumentService, DocumentsConfig};
pub use store_error::{StoreError, StoreFailure};
