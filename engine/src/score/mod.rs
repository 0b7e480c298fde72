//! Token importance for sparse attention: compact low-precision key copies, the raw q·k scores
//! computed from them (no softmax, no 1/√d: only the ranking matters), and the streaming top-k
//! merge of score blocks.

pub mod contract;
pub mod evaluator;
pub mod keys;
pub mod storage;
pub mod topk;
mod worker;
pub mod xrt;

pub use evaluator::ColdEvaluator;
pub use keys::{KeyBits, KeyPrecision, ScoringKeys};
pub use storage::StorageEvaluator;
pub use topk::{BlockMerge, HeadsMass, HeadsTopK, ScoreBlock, TopK};

/// Tokens scored per block: small enough that merging starts early, large enough to amortize.
pub const SCORE_BLOCK_TOKENS: usize = 256;
