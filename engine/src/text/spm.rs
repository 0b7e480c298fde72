//! SentencePiece's BPE as a GGUF carries it (`tokenizer.ggml.model = "llama"`: Gemma, Llama 2,
//! Mistral's first files), tokenized exactly as llama.cpp does: special and user-defined tokens
//! are cut out of the text first; each stretch between them has its spaces written `▁`, starts
//! as one symbol per character, and the adjacent pair whose joined text is the vocabulary's
//! highest-scoring token merges first (the leftmost among equals) until no pair is a token;
//! a character that is no token falls back to its byte tokens (`<0x41>`). (Every merge makes a
//! token, so only single characters can be unknown.)

use crate::error::{Error, Result};
use ahash::AHashMap;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// GGUF token types (llama.cpp's `llama_token_type`).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

const SPACE: &str = "\u{2581}";

pub struct SentencePiece {
    texts: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
    ids: AHashMap<String, u32>,
    /// The token of each byte (`<0x41>`), for characters that are no token.
    byte_ids: Vec<Option<u32>>,
    /// Special and user-defined tokens, cut out of a text before it is tokenized: for each
    /// first byte, the lengths such tokens have, longest first.
    special_lengths: Vec<Vec<usize>>,
    add_space_prefix: bool,
}

/// A candidate merge of two adjacent symbols (llama.cpp's `llm_bigram_spm`).
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    bytes: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // The higher score first; among equal scores, the leftmost.
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// A run of the text being merged: its byte range and its neighbours in the chain.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl SentencePiece {
    pub fn new(texts: Vec<String>, scores: Vec<f32>, types: Vec<i32>, add_space_prefix: bool) -> Result<Self> {
        if scores.len() != texts.len() || types.len() != texts.len() {
            return Err(Error::Tokenizer(format!(
                "{} tokens, {} scores and {} token types: the vocabulary is inconsistent",
                texts.len(),
                scores.len(),
                types.len()
            )));
        }
        let mut ids = AHashMap::with_capacity(texts.len());
        let mut byte_ids = vec![None; 256];
        let mut special_lengths = vec![Vec::new(); 256];
        for (id, (text, &kind)) in texts.iter().zip(&types).enumerate() {
            let id = id as u32;
            ids.entry(text.clone()).or_insert(id);
            if kind == BYTE {
                if let Some(b) = text.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
                    if let Ok(b) = u8::from_str_radix(b, 16) {
                        byte_ids[b as usize] = Some(id);
                    }
                }
            } else if matches!(kind, CONTROL | USER_DEFINED | UNKNOWN) && !text.is_empty() {
                special_lengths[text.as_bytes()[0] as usize].push(text.len());
            }
        }
        for lengths in &mut special_lengths {
            lengths.sort_unstable_by(|a, b| b.cmp(a));
            lengths.dedup();
        }
        Ok(Self { texts, scores, types, ids, byte_ids, special_lengths, add_space_prefix })
    }

    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    fn is_special(&self, id: u32) -> bool {
        matches!(self.types[id as usize], CONTROL | USER_DEFINED | UNKNOWN)
    }

    /// The ids of `text`, special-token text becoming its token.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut after_special = true;
        let mut raw_start = 0;
        let mut at = 0;
        let bytes = text.as_bytes();
        while at < bytes.len() {
            let special = self.special_lengths[bytes[at] as usize].iter().find_map(|&len| {
                let candidate = text.get(at..at + len)?;
                self.ids.get(candidate).filter(|&&id| self.is_special(id)).map(|&id| (id, len))
            });
            match special {
                Some((id, len)) => {
                    if raw_start < at {
                        self.encode_raw(&text[raw_start..at], after_special, out);
                    }
                    out.push(id);
                    after_special = true;
                    at += len;
                    raw_start = at;
                }
                None => at += 1,
            }
        }
        if raw_start < bytes.len() {
            self.encode_raw(&text[raw_start..], after_special, out);
        }
    }

    /// The ids of `text` as plain text (a special token's string as its characters), for text in
    /// the middle of a prompt.
    pub fn encode_plain(&self, text: &str, out: &mut Vec<u32>) {
        self.encode_raw(text, false, out);
    }

    /// The strings of the control tokens.
    pub fn control_texts(&self) -> Vec<String> {
        self.types.iter().zip(&self.texts).filter(|(&t, _)| t == CONTROL).map(|(_, text)| text.clone()).collect()
    }

    /// One stretch of text without special tokens.
    fn encode_raw(&self, raw: &str, after_special: bool, out: &mut Vec<u32>) {
        let mut text = String::with_capacity(raw.len() * 3 / 2 + 3);
        if self.add_space_prefix && after_special {
            text.push_str(SPACE);
        }
        for c in raw.chars() {
            match c {
                ' ' => text.push_str(SPACE),
                c => text.push(c),
            }
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: Some(i + 1).filter(|_| start + c.len_utf8() < text.len()),
            });
        }
        if symbols.is_empty() {
            return;
        }
        let mut queue = BinaryHeap::new();
        let try_pair =
            |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: Option<usize>, right: Option<usize>| {
                let (Some(left), Some(right)) = (left, right) else { return };
                let (l, r) = (symbols[left], symbols[right]);
                let joined = &text[l.start..r.start + r.len];
                if let Some(&id) = self.ids.get(joined) {
                    queue.push(Bigram { left, right, score: self.scores[id as usize], bytes: joined.len() });
                }
            };
        for i in 1..symbols.len() {
            try_pair(&symbols, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(pair) = queue.pop() {
            let (l, r) = (symbols[pair.left], symbols[pair.right]);
            // Stale: one side was merged into something else since.
            if l.len == 0 || r.len == 0 || l.len + r.len != pair.bytes {
                continue;
            }
            symbols[pair.left].len += r.len;
            symbols[pair.right].len = 0;
            symbols[pair.left].next = r.next;
            if let Some(next) = r.next {
                symbols[next].prev = Some(pair.left);
            }
            try_pair(&symbols, &mut queue, symbols[pair.left].prev, Some(pair.left));
            try_pair(&symbols, &mut queue, Some(pair.left), symbols[pair.left].next);
        }
        let mut i = Some(0);
        while let Some(at) = i {
            let piece = &text[symbols[at].start..][..symbols[at].len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize])),
            }
            i = symbols[at].next;
        }
    }

    /// The text of `ids`: `▁` back to spaces, byte tokens as their bytes, control tokens left
    /// out when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            let (Some(text), Some(&kind)) = (self.texts.get(id as usize), self.types.get(id as usize)) else {
                continue;
            };
            match kind {
                BYTE => {
                    let byte = text.strip_prefix("<0x").and_then(|t| t.strip_suffix('>'));
                    if let Some(b) = byte.and_then(|b| u8::from_str_radix(b, 16).ok()) {
                        bytes.push(b);
                    }
                }
                CONTROL | UNKNOWN if skip_special => {}
                NORMAL => bytes.extend_from_slice(text.replace(SPACE, " ").as_bytes()),
                _ => bytes.extend_from_slice(text.as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(entries: &[(&str, f32, i32)]) -> SentencePiece {
        let mut texts: Vec<String> = entries.iter().map(|e| e.0.to_string()).collect();
        let mut scores: Vec<f32> = entries.iter().map(|e| e.1).collect();
        let mut types: Vec<i32> = entries.iter().map(|e| e.2).collect();
        for b in 0..=255u8 {
            texts.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(BYTE);
        }
        SentencePiece::new(texts, scores, types, false).unwrap()
    }

    #[test]
    fn the_best_scoring_pair_merges_first_and_unknown_text_falls_back_to_bytes() {
        let v = vocab(&[
            ("<eos>", 0.0, CONTROL),
            ("\n", 0.0, USER_DEFINED),
            ("h", -1.0, NORMAL),
            ("e", -1.0, NORMAL),
            ("l", -1.0, NORMAL),
            ("o", -1.0, NORMAL),
            ("\u{2581}", -1.0, NORMAL),
            ("he", -3.0, NORMAL),
            ("ll", -2.0, NORMAL),
            ("llo", -2.5, NORMAL),
            ("hello", -4.0, NORMAL),
            ("\u{2581}h", -5.0, NORMAL),
        ]);
        let mut ids = Vec::new();
        v.encode("hello", &mut ids);
        assert_eq!(ids, [v.token_to_id("hello").unwrap()]);
        ids.clear();
        // "é" is no token: its two bytes; the newline and <eos> are cut out first.
        v.encode("he é\n<eos>", &mut ids);
        let expected: Vec<u32> =
            ["he", "\u{2581}", "<0xC3>", "<0xA9>", "\n", "<eos>"].iter().map(|t| v.token_to_id(t).unwrap()).collect();
        assert_eq!(ids, expected);
        assert_eq!(v.decode(&ids, true), "he é\n");
        assert_eq!(v.decode(&ids, false), "he é\n<eos>");
    }
}
