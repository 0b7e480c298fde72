//! A byte-level BPE model packed for memory, run inside the `tokenizers` pipeline (whose
//! pre-tokenizers, special tokens and decoder stay the crate's).
//!
//! The crate's `BPE` keeps its vocabulary twice, as hash maps of `String`s, plus a hash map of
//! merges: for Qwen2's 151,936 tokens that is ~24 MB resident, a third of what the memory bound
//! leaves the process beside weights and cache at 32K. Here every token's text lies end to end in
//! one string, and both lookups (text → id, pair → merge) are open-addressed tables of `u32`.
//! Merging follows the crate's `Word::merge_all` step for step: the lowest-ranked pair first, the
//! leftmost of equal ranks, a queued pair dropped once its two symbols have changed, and a
//! character outside the vocabulary left out (a byte-level alphabet has none).

use crate::error::{Error, Result};
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use tokenizers::models::bpe::BpeTrainer;
use tokenizers::{Model, Token};

/// Two tokens that merge into a third; a merge's rank is its place in the merge list.
#[derive(Clone, Copy)]
struct Merge {
    left: u32,
    right: u32,
    merged: u32,
}

pub struct PackedBpe {
    /// Every token's text, end to end: token `i` is `text[ends[i - 1]..ends[i]]` (from 0 for 0).
    text: String,
    ends: Vec<u32>,
    ids_by_text: IdIndex,
    /// `[c]`: the id of the one-character token `c` (or `NONE`), for the characters below
    /// `CHAR_TABLE_LEN`, which hold GPT-2's whole byte alphabet: a word's first lookups.
    char_ids: Vec<u32>,
    /// By rank.
    merges: Vec<Merge>,
    ranks_by_pair: IdIndex,
}

impl PackedBpe {
    /// `tokens` in id order; `merges` in rank order, each two tokens' texts with a space between
    /// (GGUF's `tokenizer.ggml.merges`). As with the crate's `BPE`, a text given twice takes the
    /// later id and a pair given twice the later rank.
    pub fn new<'a>(
        tokens: impl Iterator<Item = &'a str> + Clone,
        merges: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<Self> {
        let text_bytes: usize = tokens.clone().map(str::len).sum();
        let count = tokens.clone().count();
        if text_bytes > u32::MAX as usize || count >= u32::MAX as usize {
            return Err(Error::Tokenizer(format!(
                "a vocabulary of {count} tokens and {text_bytes} bytes is too large"
            )));
        }
        let mut text = String::with_capacity(text_bytes);
        let mut ends = Vec::with_capacity(count);
        for token in tokens {
            text.push_str(token);
            ends.push(text.len() as u32);
        }
        let mut bpe = Self {
            text,
            ends,
            ids_by_text: IdIndex::for_keys(count),
            char_ids: Vec::new(),
            merges: Vec::with_capacity(merges.len()),
            ranks_by_pair: IdIndex::for_keys(merges.len()),
        };
        for id in 0..count as u32 {
            let hash = text_hash(bpe.text_of(id).as_bytes(), b"");
            let (text, ends) = (&bpe.text, &bpe.ends);
            bpe.ids_by_text.insert(hash, id, |other| slice(text, ends, other) == slice(text, ends, id));
        }
        bpe.char_ids = (0..CHAR_TABLE_LEN)
            .map(|c| char::from_u32(c).and_then(|c| bpe.id_of_parts(c.encode_utf8(&mut [0; 4]), "")).unwrap_or(NONE))
            .collect();
        for merge in merges {
            let (left, right) =
                merge.split_once(' ').ok_or_else(|| Error::Tokenizer(format!("bad merge '{merge}'")))?;
            let id = |part: &str| {
                bpe.id_of_parts(part, "")
                    .ok_or_else(|| Error::Tokenizer(format!("merge '{merge}': '{part}' is not in the vocabulary")))
            };
            let merge = Merge {
                left: id(left)?,
                right: id(right)?,
                merged: bpe.id_of_parts(left, right).ok_or_else(|| {
                    Error::Tokenizer(format!("merge '{merge}': '{left}{right}' is not in the vocabulary"))
                })?,
            };
            let rank = bpe.merges.len() as u32;
            bpe.merges.push(merge);
            let merges = &bpe.merges;
            bpe.ranks_by_pair.insert(pair_hash(merge.left, merge.right), rank, |other| {
                let other = merges[other as usize];
                (other.left, other.right) == (merge.left, merge.right)
            });
        }
        Ok(bpe)
    }

    fn text_of(&self, id: u32) -> &str {
        slice(&self.text, &self.ends, id)
    }

    /// The id of the token whose text is `head` followed by `tail`.
    fn id_of_parts(&self, head: &str, tail: &str) -> Option<u32> {
        self.ids_by_text.find(text_hash(head.as_bytes(), tail.as_bytes()), |id| {
            let text = self.text_of(id);
            text.len() == head.len() + tail.len() && text.starts_with(head) && text.ends_with(tail)
        })
    }

    fn char_id(&self, c: char, text: &str) -> Option<u32> {
        match self.char_ids.get(c as usize) {
            Some(&id) => (id != NONE).then_some(id),
            None => self.id_of_parts(text, ""),
        }
    }

    fn rank_of(&self, left: u32, right: u32) -> Option<u32> {
        self.ranks_by_pair.find(pair_hash(left, right), |rank| {
            let merge = self.merges[rank as usize];
            (merge.left, merge.right) == (left, right)
        })
    }

    /// The merges in rank order, as the two tokens' texts.
    pub fn merge_texts(&self) -> impl Iterator<Item = (&str, &str)> {
        self.merges.iter().map(|m| (self.text_of(m.left), self.text_of(m.right)))
    }
}

fn slice<'a>(text: &'a str, ends: &[u32], id: u32) -> &'a str {
    let id = id as usize;
    let start = if id == 0 { 0 } else { ends[id - 1] as usize };
    &text[start..ends[id] as usize]
}

/// One of a word's symbols while it is merged; a merged-away symbol keeps `len` 0.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    len: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;
const CHAR_TABLE_LEN: u32 = 512;

/// A word's symbols and merge queue, kept from one word to the next.
#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Reverse<(u32, u32)>>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

impl PackedBpe {
    fn merge(&self, word: &str, Scratch { symbols, queue }: &mut Scratch) -> Vec<Token> {
        symbols.clear();
        for (start, c) in word.char_indices() {
            if let Some(id) = self.char_id(c, &word[start..start + c.len_utf8()]) {
                let at = symbols.len() as u32;
                // The first symbol's `prev` wraps to NONE; the last one's `next` is set below.
                symbols.push(Symbol { id, len: c.len_utf8() as u32, prev: at.wrapping_sub(1), next: at + 1 });
            }
        }
        if let Some(last) = symbols.last_mut() {
            last.next = NONE;
        }
        // A min-heap on (rank, position): the lowest rank first, the leftmost of equal ranks.
        queue.clear();
        queue.extend(
            symbols
                .windows(2)
                .enumerate()
                .filter_map(|(at, pair)| self.rank_of(pair[0].id, pair[1].id).map(|rank| Reverse((rank, at as u32)))),
        );
        while let Some(Reverse((rank, at))) = queue.pop() {
            let left = symbols[at as usize];
            if left.len == 0 || left.next == NONE {
                continue;
            }
            let right = symbols[left.next as usize];
            let merged = self.merges[rank as usize].merged;
            // Queued for a pair that has since changed: the crate's test, by the merged token.
            if self.rank_of(left.id, right.id).is_none_or(|now| self.merges[now as usize].merged != merged) {
                continue;
            }
            symbols[left.next as usize].len = 0;
            symbols[at as usize] = Symbol { id: merged, len: left.len + right.len, prev: left.prev, next: right.next };
            if right.next != NONE {
                symbols[right.next as usize].prev = at;
                if let Some(rank) = self.rank_of(merged, symbols[right.next as usize].id) {
                    queue.push(Reverse((rank, at)));
                }
            }
            if left.prev != NONE {
                if let Some(rank) = self.rank_of(symbols[left.prev as usize].id, merged) {
                    queue.push(Reverse((rank, left.prev)));
                }
            }
        }
        // Offsets run on from one kept symbol to the next, as the crate counts them.
        let mut offset = 0;
        symbols
            .iter()
            .filter(|s| s.len > 0)
            .map(|s| {
                let start = offset;
                offset += s.len as usize;
                Token::new(s.id, self.text_of(s.id).to_string(), (start, offset))
            })
            .collect()
    }
}

impl Model for PackedBpe {
    type Trainer = BpeTrainer;

    fn tokenize(&self, word: &str) -> tokenizers::Result<Vec<Token>> {
        SCRATCH.with_borrow_mut(|scratch| Ok(self.merge(word, scratch)))
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.id_of_parts(token, "")
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        ((id as usize) < self.ends.len()).then(|| self.text_of(id).to_string())
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        (0..self.ends.len() as u32).map(|id| (self.text_of(id).to_string(), id)).collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.ends.len()
    }

    fn save(&self, _folder: &Path, _prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        Err("a packed BPE is saved as a whole tokenizer (Tokenizer::to_json)".into())
    }

    fn get_trainer(&self) -> BpeTrainer {
        BpeTrainer::default()
    }
}

/// An open-addressed index of ids, found by a hash of their key and a test of it. Slots hold
/// id + 1, so 0 marks an empty one; the table is kept at most two thirds full.
struct IdIndex {
    slots: Vec<u32>,
}

impl IdIndex {
    fn for_keys(count: usize) -> Self {
        Self { slots: vec![0; (count + count / 2).max(2).next_power_of_two()] }
    }

    fn find(&self, hash: u64, mut is_key_of: impl FnMut(u32) -> bool) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut at = hash as usize & mask;
        loop {
            match self.slots[at] {
                0 => return None,
                slot if is_key_of(slot - 1) => return Some(slot - 1),
                _ => at = (at + 1) & mask,
            }
        }
    }

    /// Puts `id` in its key's slot, in place of an id with the same key.
    fn insert(&mut self, hash: u64, id: u32, mut same_key: impl FnMut(u32) -> bool) {
        let mask = self.slots.len() - 1;
        let mut at = hash as usize & mask;
        while self.slots[at] != 0 && !same_key(self.slots[at] - 1) {
            at = (at + 1) & mask;
        }
        self.slots[at] = id + 1;
    }
}

/// FNV-1a over `head` then `tail` (so a merge's two halves find the token they make), mixed so
/// that the low bits index well.
fn text_hash(head: &[u8], tail: &[u8]) -> u64 {
    let hash =
        head.iter().chain(tail).fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    mix(hash)
}

fn pair_hash(left: u32, right: u32) -> u64 {
    mix((left as u64) << 32 | right as u64)
}

fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::models::bpe::BPE;

    /// The crate's `BPE` on the same vocabulary and merges.
    fn reference(tokens: &[&str], merges: &[&str]) -> BPE {
        let vocab: ahash::AHashMap<String, u32> =
            tokens.iter().enumerate().map(|(id, t)| (t.to_string(), id as u32)).collect();
        let merges =
            merges.iter().map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).unwrap()).collect();
        BPE::builder().vocab_and_merges(vocab, merges).build().unwrap()
    }

    fn same_tokens(packed: &PackedBpe, crate_bpe: &BPE, word: &str) {
        let ours: Vec<_> = packed.tokenize(word).unwrap().into_iter().map(|t| (t.id, t.value, t.offsets)).collect();
        let theirs: Vec<_> =
            crate_bpe.tokenize(word).unwrap().into_iter().map(|t| (t.id, t.value, t.offsets)).collect();
        assert_eq!(ours, theirs, "word {word:?}");
    }

    #[test]
    fn merges_as_the_crate_does_on_ties_chains_and_stale_pairs() {
        // "abc" can merge as ab+c or a+bc, "aaaa" chains equal pairs (leftmost first), and "x"
        // has no merge; "é" is two bytes in one symbol.
        let tokens = ["a", "b", "c", "x", "é", "ab", "bc", "abc", "aa", "aaaa", "aaa", "éa"];
        let merges = ["b c", "a b", "a bc", "ab c", "a a", "aa aa", "aa a", "é a"];
        let packed = PackedBpe::new(tokens.iter().copied(), merges.iter().copied()).unwrap();
        let crate_bpe = reference(&tokens, &merges);
        for word in ["abc", "aaaa", "aaaaa", "aaaaaaa", "abcabc", "xabx", "x", "éaé", "cba", "ababab", "a"] {
            same_tokens(&packed, &crate_bpe, word);
        }
        assert!(packed.tokenize("").unwrap().is_empty());
    }

    #[test]
    fn random_vocabularies_tokenize_as_the_crate_does() {
        // Random merges over a small alphabet, each merge's result added to the vocabulary; words
        // long enough for many competing pairs.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..20 {
            let mut tokens: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
            let mut merges = Vec::new();
            for _ in 0..40 {
                let (left, right) = (tokens[next(tokens.len())].clone(), tokens[next(tokens.len())].clone());
                let merged = format!("{left}{right}");
                if !tokens.contains(&merged) {
                    tokens.push(merged);
                }
                merges.push(format!("{left} {right}"));
            }
            let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
            let merges: Vec<&str> = merges.iter().map(String::as_str).collect();
            let packed = PackedBpe::new(tokens.iter().copied(), merges.iter().copied()).unwrap();
            let crate_bpe = reference(&tokens, &merges);
            for _ in 0..50 {
                let word: String = (0..1 + next(40)).map(|_| ["a", "b", "c", "d"][next(4)]).collect();
                same_tokens(&packed, &crate_bpe, &word);
            }
        }
    }

    #[test]
    fn lookups_and_bad_merges() {
        let packed = PackedBpe::new(["a", "b", "ab"].into_iter(), ["a b"].into_iter()).unwrap();
        assert_eq!(packed.token_to_id("ab"), Some(2));
        assert_eq!(packed.token_to_id("ba"), None);
        assert_eq!(packed.id_to_token(1).as_deref(), Some("b"));
        assert_eq!(packed.id_to_token(3), None);
        assert_eq!(packed.merge_texts().collect::<Vec<_>>(), [("a", "b")]);
        let missing = PackedBpe::new(["a", "b"].into_iter(), ["a b"].into_iter()).err().unwrap().to_string();
        assert!(missing.contains("'ab' is not in the vocabulary"), "{missing}");
        let unsplit = PackedBpe::new(["a", "b", "ab"].into_iter(), ["ab"].into_iter()).err().unwrap().to_string();
        assert!(unsplit.contains("bad merge 'ab'"), "{unsplit}");
    }
}
