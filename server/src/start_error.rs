//! Why the server could not start: the kinds its callers act on (a data folder another Hillside
//! holds) kept, each with the sentence a user reads.

use hillside_documents::service::OpenError;
use hillside_documents::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A configured CORS origin that is not `scheme://host[:port]`.
    #[error("'{0}' is not an origin: write it as scheme://host[:port], e.g. http://localhost:3000, or '*' for any")]
    NotAnOrigin(String),
    /// The conversations could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The document library could not be opened.
    #[error(transparent)]
    Documents(#[from] OpenError),
}

impl StartError {
    /// Another process holds the data folder's databases (a second Hillside, most likely).
    pub fn is_in_use(&self) -> bool {
        match self {
            Self::Store(e) => e.is_in_use(),
            Self::Documents(e) => e.is_in_use(),
            Self::NotAnOrigin(_) => false,
        }
    }
}
