//! Why the SmartSSD path failed: each kind a variant, naming the XRT call or the card's answer,
//! so that callers (the tiered store falling back to the storage evaluator, the server's status)
//! read the kind rather than a sentence.

use crate::score::KeyBits;
use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum XrtError {
    /// What the probe found wrong (no card, no xclbin, a library that does not load), in its words.
    #[error("{0}")]
    Unusable(String),
    #[error("the kernel does not take head_dim {head_dim} at {bits}")]
    UnsupportedShape { head_dim: usize, bits: KeyBits },
    #[error("cannot load {}: {source}", .path.display())]
    Load { path: PathBuf, source: libloading::Error },
    #[error("{} lacks {symbol}: {source}", .path.display())]
    MissingSymbol { path: PathBuf, symbol: String, source: libloading::Error },
    #[error("device {0} went away")]
    DeviceGone(u32),
    #[error("no xclbin")]
    NoXclbin,
    #[error("{what} has a NUL byte")]
    NulByte { what: &'static str },
    /// An XRT call that returned an error code.
    #[error("{call} failed: {source}")]
    Call { call: String, source: io::Error },
    #[error("the xclbin has no kernel '{name}': {source}")]
    NoKernel { name: String, source: io::Error },
    #[error("cannot allocate a {bytes}-byte{} buffer: {source}", if *.p2p { " peer-to-peer (is P2P enabled on the card?)" } else { "" })]
    Allocate { bytes: usize, p2p: bool, source: io::Error },
    #[error("cannot map a {bytes}-byte buffer: {source}")]
    Map { bytes: usize, source: io::Error },
    #[error("kernel argument {index} has no memory bank: {source}")]
    NoMemoryBank { index: i32, source: io::Error },
    /// A kernel run that ended in another ERT_CMD_STATE than completed.
    #[error("the kernel run ended in state {0} (ERT_CMD_STATE), not completed")]
    RunNotCompleted(i32),
    #[error("cannot start the XRT worker: {0}")]
    Worker(io::Error),
    /// The card's scores do not belong to the tokens it was asked about.
    #[error("the card returned position {returned} where token {expected} belongs")]
    WrongPosition { returned: u32, expected: u32 },
}
