//! Tokenizers built from GGUF metadata (BPE vocabulary, merges and pre-tokenizer name) or from a
//! `tokenizer.json`, both through the `tokenizers` crate; a GGUF's BPE runs on our packed model
//! (`bpe.rs`), which holds a large vocabulary in a fraction of the crate's memory. A GGUF's
//! SentencePiece vocabulary (Gemma's) runs on `spm.rs`, llama.cpp's algorithm.

use super::bpe::PackedBpe;
use super::controls::{Controls, Piece};
use super::reasoning::{ReasoningFormat, HARMONY_STRUCTURE};
use super::spm::SentencePiece;
use crate::error::{Error, Result};
use crate::model::gguf::Metadata;
use candle_core::quantized::gguf_file::Value;
use std::collections::HashSet;
use std::path::Path;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    SplitDelimiterBehavior, TokenizerImpl,
};

/// Llama 3's pre-tokenizer split (three-digit number groups, no leading space on letters).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer split (single digits).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// o200k's split (gpt-oss, Llama 4: `gpt-4o` in GGUF): a word takes its capitals and an
/// apostrophe's ending, digits go by threes, and punctuation keeps its trailing newlines.
const O200K_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// A GGUF's tokenizer encodes a long text a piece of about this many bytes at a time: the
/// `tokenizers` pipeline holds ~100 bytes of bookkeeping per byte of text while it runs (a
/// 785 KB book encoded at once raised resident memory by 75 MiB; in pieces, by 5).
const ENCODE_PIECE_BYTES: usize = 32 * 1024;

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

type PackedTokenizer =
    TokenizerImpl<PackedBpe, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

enum Inner {
    Gguf(PackedTokenizer),
    File(tokenizers::Tokenizer),
    SentencePiece(SentencePiece),
}

pub struct Tokenizer {
    inner: Inner,
    bos: Option<u32>,
    add_bos: bool,
    /// Tokens that end a generation (end-of-sequence and end-of-turn).
    stop_ids: HashSet<u32>,
    /// How the model marks reasoning in what it writes.
    reasoning: ReasoningFormat,
    /// Special tokens decoded as their text: the markers that split reasoning from the answer.
    kept_in_text: HashSet<u32>,
    /// Control strings in messages, marked to be read as text.
    controls: Controls,
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

fn strings<'a>(metadata: &'a Metadata, key: &str) -> Result<Vec<&'a str>> {
    let values =
        metadata.get(key).ok_or_else(|| Error::Tokenizer(format!("GGUF has no '{key}'")))?.to_vec().map_err(tok_err)?;
    values.iter().map(|v| v.to_string().map(String::as_str).map_err(tok_err)).collect()
}

/// `text` cut about every [`ENCODE_PIECE_BYTES`], between a letter and a space that another
/// letter follows: there every pre-tokenizer `pre_tokenizer` builds ends a pre-token (the next
/// one is the space and the word), and no special token spans it, so the pieces' ids are the
/// whole text's. A text without such a point past the size stays whole.
fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = rest.len();
        if rest.len() > ENCODE_PIECE_BYTES {
            let from = rest.floor_char_boundary(ENCODE_PIECE_BYTES);
            let mut chars = rest[from..].char_indices().map(|(i, c)| (from + i, c)).peekable();
            let mut before = None;
            while let Some((at, c)) = chars.next() {
                let next = chars.peek().map(|&(_, c)| c);
                if c == ' ' && before.is_some_and(char::is_alphabetic) && next.is_some_and(char::is_alphabetic) {
                    cut = at;
                    break;
                }
                before = Some(c);
            }
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

/// Hands the heap's free pages back to the system: the pipeline's bookkeeping is freed in small
/// blocks that glibc keeps resident (a 785 KB book encoded at once left 60 MiB behind).
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system; any thread may call it.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The control tokens' strings of `inner`, each with its ids as plain text (read while the
/// vocabulary is told to take special strings as text).
fn controls_of(inner: &mut Inner) -> Controls {
    let special_texts = |added: ahash::AHashMap<u32, AddedToken>| -> Vec<String> {
        added.into_values().filter(|t| t.special).map(|t| t.content).collect()
    };
    let plain_ids = |encoding: tokenizers::Result<tokenizers::Encoding>| -> Vec<u32> {
        encoding.map(|e| e.get_ids().to_vec()).unwrap_or_default()
    };
    match inner {
        Inner::Gguf(t) => {
            t.set_encode_special_tokens(true);
            let controls =
                Controls::new(special_texts(t.get_added_tokens_decoder()), |s| plain_ids(t.encode(s, false)));
            t.set_encode_special_tokens(false);
            controls
        }
        Inner::File(t) => {
            t.set_encode_special_tokens(true);
            let controls =
                Controls::new(special_texts(t.get_added_tokens_decoder()), |s| plain_ids(t.encode(s, false)));
            t.set_encode_special_tokens(false);
            controls
        }
        Inner::SentencePiece(t) => Controls::new(t.control_texts(), |s| {
            let mut ids = Vec::new();
            t.encode_plain(s, &mut ids);
            ids
        }),
    }
}

fn token_id(metadata: &Metadata, key: &str) -> Option<u32> {
    metadata.get(key).and_then(|v| v.to_u32().ok())
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let split = |regex: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(SplitPattern::Regex(regex.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(tok_err)?;
        Ok(Sequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into())
    };
    Ok(match pre {
        // SmolLM: digits one by one, then GPT-2's byte-level split.
        "smollm" => Sequence::new(vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()]).into(),
        "llama-bpe" | "llama3" | "smaug-bpe" => split(LLAMA3_SPLIT)?,
        "qwen2" | "deepseek-r1-qwen" => split(QWEN2_SPLIT)?,
        "gpt-4o" | "llama4" => split(O200K_SPLIT)?,
        "gpt2" | "default" | "" => ByteLevel::new(false, true, true).into(),
        other => {
            tracing::warn!(pre = other, "unknown GGUF pre-tokenizer; using GPT-2's byte-level split");
            ByteLevel::new(false, true, true).into()
        }
    })
}

/// The stop tokens of a vocabulary: its end-of-sequence and end-of-turn ids, and the usual
/// end-of-turn markers it has.
fn stop_ids(metadata: &Metadata, token_to_id: impl Fn(&str) -> Option<u32>) -> HashSet<u32> {
    let mut stop_ids: HashSet<u32> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|k| token_id(metadata, k))
        .collect();
    for end_of_turn in ["<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>"] {
        stop_ids.extend(token_to_id(end_of_turn));
    }
    stop_ids
}

impl Tokenizer {
    pub fn from_gguf(metadata: &Metadata) -> Result<Self> {
        let model = metadata.get("tokenizer.ggml.model").and_then(|v| v.to_string().ok()).map(String::as_str);
        match model {
            Some("gpt2") => {}
            Some("llama") => return Self::sentence_piece_from_gguf(metadata),
            _ => {
                return Err(Error::Tokenizer(format!(
                    "GGUF tokenizer model {model:?} is not supported (byte-level BPE, 'gpt2', and \
                     SentencePiece, 'llama', are); put the model's tokenizer.json next to the file"
                )))
            }
        }
        let tokens = strings(metadata, "tokenizer.ggml.tokens")?;
        let merges = strings(metadata, "tokenizer.ggml.merges")?;
        let mut inner = PackedTokenizer::new(PackedBpe::new(tokens.iter().copied(), merges.into_iter())?);
        let pre = metadata.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()).map_or("default", String::as_str);
        inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
        inner.with_decoder(Some(ByteLevel::default()));

        let types: Vec<i32> = match metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v.to_vec().map_err(tok_err)?.iter().map(|t| t.to_i32().unwrap_or(1)).collect(),
            None => Vec::new(),
        };
        let special: Vec<AddedToken> = types
            .iter()
            .enumerate()
            .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
            .map(|(i, &t)| AddedToken::from(tokens[i], t == TOKEN_TYPE_CONTROL))
            .collect();
        inner.add_special_tokens(special).map_err(tok_err)?;

        let stop_ids = stop_ids(metadata, |t| inner.token_to_id(t));
        let add_bos = matches!(metadata.get("tokenizer.ggml.add_bos_token"), Some(Value::Bool(true)));
        Ok(Self::assemble(Inner::Gguf(inner), token_id(metadata, "tokenizer.ggml.bos_token_id"), add_bos, stop_ids))
    }

    /// A GGUF's SentencePiece vocabulary (tokens, scores, types); a BOS token unless the file
    /// says otherwise, as llama.cpp assumes for this kind.
    fn sentence_piece_from_gguf(metadata: &Metadata) -> Result<Self> {
        let tokens: Vec<String> = strings(metadata, "tokenizer.ggml.tokens")?.into_iter().map(String::from).collect();
        let numbers = |key: &str| -> Result<Vec<&Value>> {
            Ok(metadata
                .get(key)
                .map(|v| v.to_vec())
                .transpose()
                .map_err(tok_err)?
                .map(|v| v.iter().collect())
                .unwrap_or_default())
        };
        let mut scores: Vec<f32> =
            numbers("tokenizer.ggml.scores")?.iter().map(|v| v.to_f32().unwrap_or(0.0)).collect();
        let mut types: Vec<i32> =
            numbers("tokenizer.ggml.token_type")?.iter().map(|v| v.to_i32().unwrap_or(1)).collect();
        scores.resize(tokens.len(), 0.0);
        types.resize(tokens.len(), 1);
        let flag = |key: &str, default: bool| match metadata.get(key) {
            Some(Value::Bool(b)) => *b,
            _ => default,
        };
        let spm = SentencePiece::new(tokens, scores, types, flag("tokenizer.ggml.add_space_prefix", true))?;
        let stop_ids = stop_ids(metadata, |t| spm.token_to_id(t));
        let add_bos = flag("tokenizer.ggml.add_bos_token", true);
        Ok(Self::assemble(
            Inner::SentencePiece(spm),
            token_id(metadata, "tokenizer.ggml.bos_token_id"),
            add_bos,
            stop_ids,
        ))
    }

    /// Loads `tokenizer.json`; stop tokens come from the checkpoint's `config.json`/`generation_config.json`
    /// `eos_token_id`, plus the usual end-of-turn markers.
    pub fn from_file(path: &Path, eos_ids: &[u32], bos: Option<u32>, add_bos: bool) -> Result<Self> {
        let inner =
            tokenizers::Tokenizer::from_file(path).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let mut stop_ids: HashSet<u32> = eos_ids.iter().copied().collect();
        for end_of_turn in ["<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "</s>"] {
            if let Some(id) = inner.token_to_id(end_of_turn) {
                stop_ids.insert(id);
            }
        }
        Ok(Self::assemble(Inner::File(inner), bos, add_bos, stop_ids))
    }

    /// A tokenizer of `inner`, with what its vocabulary says about reasoning. A harmony model
    /// (gpt-oss) ends its turn with `<|return|>` or `<|call|>`; its `<|end|>` ends only a message,
    /// such as its reasoning, after which the answer follows (llama.cpp drops it from the stop
    /// tokens the same way).
    fn assemble(mut inner: Inner, bos: Option<u32>, add_bos: bool, mut stop_ids: HashSet<u32>) -> Self {
        let controls = controls_of(&mut inner);
        let mut tokenizer = Self {
            inner,
            bos,
            add_bos,
            stop_ids: HashSet::new(),
            reasoning: ReasoningFormat::None,
            kept_in_text: HashSet::new(),
            controls,
        };
        let id = |t: &str| tokenizer.token_id(t);
        let reasoning = ReasoningFormat::of_vocabulary(|t| id(t).is_some());
        let mut kept_in_text = HashSet::new();
        if reasoning == ReasoningFormat::Harmony {
            if let (Some(ret), Some(call)) = (id("<|return|>"), id("<|call|>")) {
                stop_ids.extend([ret, call]);
                if let Some(end) = id("<|end|>") {
                    stop_ids.remove(&end);
                }
            }
            kept_in_text.extend(HARMONY_STRUCTURE.iter().chain(&["<|constrain|>"]).filter_map(|t| id(t)));
        }
        tokenizer.stop_ids = stop_ids;
        tokenizer.reasoning = reasoning;
        tokenizer.kept_in_text = kept_in_text;
        tokenizer
    }

    /// Token ids of `text`; special-token text (like `<|im_start|>`) becomes the special token.
    /// A BOS token is prepended where the model asks for one. For text from a user or a document,
    /// see [`Self::encode_prompt`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.add_bos {
            ids.extend(self.bos);
        }
        self.encode_special(text, &mut ids)?;
        Ok(ids)
    }

    /// `text` with every control string in it marked, to be read as plain text by
    /// [`Self::encode_prompt`] once a chat template has placed it.
    pub fn mark_controls<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        self.controls.mark(text)
    }

    /// Token ids of a prompt whose messages were [`Self::mark_controls`]ed: control tokens come
    /// only from the template's text, a message's control strings are their characters. A BOS
    /// token is prepended where the model asks for one.
    pub fn encode_prompt(&self, rendered: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.add_bos {
            ids.extend(self.bos);
        }
        for piece in self.controls.pieces(rendered) {
            match piece {
                Piece::Template(text) => self.encode_special(text, &mut ids)?,
                Piece::Text(plain) => ids.extend_from_slice(plain),
            }
        }
        Ok(ids)
    }

    /// Token ids of `text` read as plain text, control strings included (a BOS token first where
    /// the model asks for one).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_prompt(&self.mark_controls(text))
    }

    /// Appends the ids of `text`, special-token text becoming the special token.
    fn encode_special(&self, text: &str, ids: &mut Vec<u32>) -> Result<()> {
        match &self.inner {
            Inner::Gguf(t) => {
                for piece in pieces(text) {
                    ids.extend_from_slice(t.encode(piece, false).map_err(tok_err)?.get_ids());
                    if piece.len() < text.len() {
                        release_free_heap();
                    }
                }
            }
            // A tokenizer.json's pre-tokenizer may treat a text's start specially (a prefix space).
            Inner::File(t) => ids.extend_from_slice(t.encode(text, false).map_err(tok_err)?.get_ids()),
            Inner::SentencePiece(t) => t.encode(text, ids),
        }
        Ok(())
    }

    /// Text of `ids`, special tokens left out, except the markers of the model's reasoning
    /// format (see [`Self::reasoning_format`]).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if !ids.iter().any(|id| self.kept_in_text.contains(id)) {
            return self.decode_text(ids);
        }
        let mut text = String::new();
        for run in ids.split_inclusive(|id| self.kept_in_text.contains(id)) {
            match run.split_last() {
                Some((last, before)) if self.kept_in_text.contains(last) => {
                    text += &self.decode_text(before)?;
                    text += &self.token_text(*last).unwrap_or_default();
                }
                _ => text += &self.decode_text(run)?,
            }
        }
        Ok(text)
    }

    /// How the model marks reasoning apart from its answer.
    pub fn reasoning_format(&self) -> ReasoningFormat {
        self.reasoning
    }

    /// How the model's reply to `prompt` marks its reasoning (the prompt may have opened it).
    pub fn reasoning_format_after(&self, prompt: &[u32]) -> ReasoningFormat {
        let end = self.decode(&prompt[prompt.len().saturating_sub(4)..]).unwrap_or_default();
        self.reasoning.after(&end)
    }

    fn decode_text(&self, ids: &[u32]) -> Result<String> {
        match &self.inner {
            Inner::Gguf(t) => t.decode(ids, true).map_err(tok_err),
            Inner::File(t) => t.decode(ids, true).map_err(tok_err),
            Inner::SentencePiece(t) => Ok(t.decode(ids, true)),
        }
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.contains(&id)
    }

    /// The id of the token whose text is `text`, if the vocabulary has one.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(t) => t.token_to_id(text),
            Inner::File(t) => t.token_to_id(text),
            Inner::SentencePiece(t) => t.token_to_id(text),
        }
    }

    pub fn token_text(&self, id: u32) -> Option<String> {
        match &self.inner {
            Inner::Gguf(t) => t.id_to_token(id),
            Inner::File(t) => t.id_to_token(id),
            Inner::SentencePiece(t) => t.id_to_token(id).map(String::from),
        }
    }

    /// The tokenizer as a `tokenizer.json` document (to export a GGUF model's tokenizer): a GGUF's
    /// packed BPE is written as the crate's `BPE`, which reads it back.
    pub fn to_json(&self) -> Result<String> {
        let packed = match &self.inner {
            Inner::File(t) => return t.to_string(true).map_err(tok_err),
            Inner::Gguf(packed) => packed,
            Inner::SentencePiece(_) => {
                return Err(Error::Tokenizer("a SentencePiece vocabulary is not exported as tokenizer.json".into()))
            }
        };
        let model = packed.get_model();
        let merges = model.merge_texts().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(model.get_vocab().into_iter().collect::<ahash::AHashMap<_, _>>(), merges)
            .build()
            .map_err(tok_err)?;
        let mut exported = tokenizers::Tokenizer::new(bpe);
        exported.with_pre_tokenizer(packed.get_pre_tokenizer().cloned());
        exported.with_decoder(packed.get_decoder().cloned());
        let mut added: Vec<(u32, AddedToken)> = packed.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        exported.add_special_tokens(added.into_iter().map(|(_, token)| token)).map_err(tok_err)?;
        exported.to_string(true).map_err(tok_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cut_only_between_a_word_and_the_next() {
        let filler = "  12, 34;\n\t- ".repeat(ENCODE_PIECE_BYTES / 8);
        let text = format!("{filler}x y{filler}€ é Éclair{filler}end.");
        let cut: Vec<&str> = pieces(&text).collect();
        assert_eq!(cut.concat(), text);
        assert_eq!(cut.len(), 3, "{:?}", cut.iter().map(|p| p.len()).collect::<Vec<_>>());
        assert!(
            cut[0].ends_with("x")
                && cut[1].starts_with(" y")
                && cut[1].ends_with("€ é")
                && cut[2].starts_with(" Éclair")
        );
        assert_eq!(pieces(&filler).count(), 1, "no word follows a word");
        assert_eq!(pieces("").count(), 0);
        assert_eq!(pieces("short text").collect::<Vec<_>>(), ["short text"]);
    }
}
