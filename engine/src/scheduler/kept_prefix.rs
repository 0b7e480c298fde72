//! Prompt prefixes whose K/V is kept outside the scheduler (a document's, on disk): a request
//! may carry one, and then its prefix is loaded instead of prefilled when no cached sequence
//! holds it, and saved once its generation has computed it.

use crate::generate::Sequence;

/// Where a request's prefix K/V is kept. Loading and saving never fail a request: a prefix that
/// cannot be loaded is prefilled, one that cannot be saved is not kept (the implementation
/// logs why).
pub trait KeptPrefix: Send {
    /// How many of the prompt's first tokens it covers.
    fn tokens(&self) -> usize;

    /// Fills the new, empty `seq`'s store with the prefix's K/V; `false` if there is none to
    /// load, or what there was could not be used (and is forgotten).
    fn load(&mut self, seq: &mut Sequence) -> bool;

    /// Keeps the first [`KeptPrefix::tokens`] of `seq`'s K/V (a no-op if they are kept already).
    fn save(&mut self, seq: &mut Sequence);
}

/// Tokens `a` and `b` share from the start.
pub(super) fn shared_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
