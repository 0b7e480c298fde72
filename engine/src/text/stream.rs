//! Turning a stream of token ids into text deltas that never split a UTF-8 character and never
//! drop the space a token carries.
//!
//! Decoding one token at a time is wrong for both reasons (a character can span tokens; some
//! decoders strip a token's leading space at the start of a string), so each step decodes a
//! short window of recent tokens twice, with and without the new ones, and emits the
//! difference once it is whole.

use super::tokenizer::Tokenizer;
use crate::error::Result;

#[derive(Debug, Default)]
pub struct TextStream {
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix: usize,
    /// End of what has been emitted.
    read: usize,
}

impl TextStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token; returns the text it completes, if any.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let before = tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let after = tokenizer.decode(&self.ids[self.prefix..])?;
        if after.len() <= before.len() || after.ends_with('\u{FFFD}') {
            return Ok(None); // an incomplete character, or a token with no text (yet)
        }
        let delta = match after.strip_prefix(before.as_str()) {
            Some(rest) => rest.to_string(),
            // The window decodes differently with the new token (rare; merges across tokens):
            // emit what follows the common part.
            None => after.get(before.len()..).unwrap_or_default().to_string(),
        };
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(Some(delta))
    }

    /// Whatever is left undecoded at the end of the stream (for example a lone partial character).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<Option<String>> {
        if self.read == self.ids.len() {
            return Ok(None);
        }
        let before = tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let after = tokenizer.decode(&self.ids[self.prefix..])?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(after.get(before.len()..).filter(|s| !s.is_empty()).map(str::to_string))
    }
}
