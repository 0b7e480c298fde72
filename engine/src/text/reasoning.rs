//! Keeping a model's reasoning apart from its answer, as the text streams out.
//!
//! Reasoning models write their reasoning first, marked in one of two ways, and OpenAI-compatible
//! servers (llama.cpp, vLLM) return it as `reasoning_content` beside the answer's `content`:
//! - `<think>` … `</think>`, then the answer (Qwen3, DeepSeek-R1);
//! - OpenAI's harmony format (gpt-oss): messages `<|channel|>NAME<|message|>` … `<|end|>`, each
//!   after the first opened by `<|start|>assistant`; the `analysis` channel is reasoning, the
//!   `final` one (and a `commentary` preamble) the answer.
//!
//! Markers may arrive split across pieces of text, so a piece that could begin one is held back
//! until the next piece says what it is.

/// How a model marks its reasoning in what it generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// No reasoning: every piece is answer.
    #[default]
    None,
    /// `<think>` … `</think>`.
    Think,
    /// `<think>` … `</think>`, the prompt having opened `<think>` already (templates that start
    /// the model's turn inside its reasoning, as DeepSeek-R1's and Qwen3's thinking models' do).
    ThinkOpened,
    /// Harmony's channels.
    Harmony,
}

impl ReasoningFormat {
    /// This format for a reply to a prompt ending in `prompt_end`: `<think>` may be open already.
    pub fn after(self, prompt_end: &str) -> Self {
        match self {
            Self::Think if prompt_end.trim_end().ends_with(THINK_OPEN) => Self::ThinkOpened,
            other => other,
        }
    }

    /// The format of a vocabulary with these tokens.
    pub fn of_vocabulary(has: impl Fn(&str) -> bool) -> Self {
        if HARMONY_STRUCTURE.iter().all(|t| has(t)) {
            Self::Harmony
        } else if has(THINK_OPEN) && has(THINK_CLOSE) {
            Self::Think
        } else {
            Self::None
        }
    }
}

/// Harmony's structural tokens, which a harmony model's text must keep to be split.
pub const HARMONY_STRUCTURE: [&str; 4] = [CHANNEL, MESSAGE, START, END];

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const START: &str = "<|start|>";
const END: &str = "<|end|>";
/// A harmony header longer than this without `<|message|>` is not one: it is answer text.
const MAX_HEADER_BYTES: usize = 256;

/// Text routed to the reasoning and to the answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Parts {
    pub reasoning: String,
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before anything: the text may open with a marker.
    Opening,
    /// Inside reasoning.
    Reasoning,
    /// Inside the answer.
    Content,
    /// Harmony: reading a message's header, up to `<|message|>`.
    Header,
}

/// Splits one generation's text into reasoning and answer.
#[derive(Debug)]
pub struct ReasoningSplit {
    format: ReasoningFormat,
    state: State,
    /// Text not routed yet: a marker's possible beginning, or a harmony header.
    held: String,
    /// Whether some reasoning, and some answer, went out: the whitespace a part opens with is
    /// the markers' layout, not text.
    started: [bool; 2],
}

impl ReasoningSplit {
    pub fn new(format: ReasoningFormat) -> Self {
        let state = match format {
            ReasoningFormat::None => State::Content,
            ReasoningFormat::Think => State::Opening,
            ReasoningFormat::ThinkOpened => State::Reasoning,
            ReasoningFormat::Harmony => State::Header,
        };
        Self { format, state, held: String::new(), started: [false; 2] }
    }

    /// Routes the next piece of generated text; returns what can be routed so far.
    pub fn push(&mut self, text: &str) -> Parts {
        let mut parts = Parts::default();
        if self.format == ReasoningFormat::None {
            parts.content.push_str(text);
            return parts;
        }
        self.held.push_str(text);
        while self.step(&mut parts) {}
        parts
    }

    /// The text still held back, at the end of the generation: a marker's unfinished beginning
    /// is text after all.
    pub fn finish(&mut self) -> Parts {
        let mut parts = Parts::default();
        let rest = std::mem::take(&mut self.held);
        match self.state {
            State::Reasoning => self.route(&rest, true, &mut parts),
            // An unfinished harmony header is not shown: it names a channel, it says nothing.
            State::Header if rest.starts_with("<|") => {}
            _ => self.route(&rest, false, &mut parts),
        }
        parts
    }

    /// Routes what `held` allows; false once it must wait for more text.
    fn step(&mut self, parts: &mut Parts) -> bool {
        match (self.format, self.state) {
            (_, State::Opening) => {
                let start = self.held.trim_start();
                if let Some(rest) = start.strip_prefix(THINK_OPEN) {
                    self.held = rest.to_string();
                    self.state = State::Reasoning;
                    true
                } else if THINK_OPEN.starts_with(start) {
                    false
                } else {
                    self.state = State::Content;
                    true
                }
            }
            (ReasoningFormat::Think | ReasoningFormat::ThinkOpened, State::Reasoning) => {
                self.until(THINK_CLOSE, State::Content, parts, true)
            }
            (ReasoningFormat::Harmony, State::Reasoning) => self.until(END, State::Header, parts, true),
            (ReasoningFormat::Harmony, State::Content) => self.until(END, State::Header, parts, false),
            (ReasoningFormat::Harmony, State::Header) => {
                if let Some(at) = self.held.find(MESSAGE) {
                    let header = &self.held[..at];
                    let channel = header.rsplit(CHANNEL).next().unwrap_or("").split([' ', '<']).next().unwrap_or("");
                    self.state = if header.contains(CHANNEL) && channel == "analysis" {
                        State::Reasoning
                    } else {
                        State::Content
                    };
                    self.held.drain(..at + MESSAGE.len());
                    true
                } else if self.held.is_empty()
                    || ((self.held.starts_with("<|") || self.held == "<") && self.held.len() <= MAX_HEADER_BYTES)
                {
                    false
                } else {
                    // Text with no header: the model answers without harmony's framing.
                    self.state = State::Content;
                    true
                }
            }
            (_, State::Content) => {
                let rest = std::mem::take(&mut self.held);
                self.route(&rest, false, parts);
                false
            }
            (_, State::Reasoning | State::Header) => {
                unreachable!("only harmony reads headers; plain text has no reasoning")
            }
        }
    }

    /// Routes `held` up to `marker` to reasoning or answer, then goes to `next`; without the
    /// marker, routes all but a possible beginning of it.
    fn until(&mut self, marker: &str, next: State, parts: &mut Parts, reasoning: bool) -> bool {
        let held = std::mem::take(&mut self.held);
        if let Some(at) = held.find(marker) {
            self.route(&held[..at], reasoning, parts);
            self.held = held[at + marker.len()..].to_string();
            self.state = next;
            return true;
        }
        let routed = held.len() - partial_marker_len(&held, marker);
        self.route(&held[..routed], reasoning, parts);
        self.held = held[routed..].to_string();
        false
    }

    /// Adds `text` to the reasoning or the answer, less the whitespace that would open it.
    fn route(&mut self, text: &str, reasoning: bool, parts: &mut Parts) {
        let started = &mut self.started[usize::from(!reasoning)];
        let text = if *started { text } else { text.trim_start() };
        *started |= !text.is_empty();
        (if reasoning { &mut parts.reasoning } else { &mut parts.content }).push_str(text);
    }
}

/// Length of the longest end of `text` that begins `marker`.
fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits `text` fed in pieces of `piece` characters.
    fn split(format: ReasoningFormat, text: &str, piece: usize) -> Parts {
        let mut split = ReasoningSplit::new(format);
        let mut all = Parts::default();
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(piece) {
            let p = split.push(&chunk.iter().collect::<String>());
            all.reasoning += &p.reasoning;
            all.content += &p.content;
        }
        let p = split.finish();
        all.reasoning += &p.reasoning;
        all.content += &p.content;
        all
    }

    fn parts(reasoning: &str, content: &str) -> Parts {
        Parts { reasoning: reasoning.into(), content: content.into() }
    }

    #[test]
    fn harmony_keeps_the_analysis_channel_apart_in_pieces_of_any_size() {
        let text = "<|channel|>analysis<|message|>The user greets; reply <kindly>.<|end|>\
                    <|start|>assistant<|channel|>final<|message|>Hello! How can I help?";
        for piece in [1, 2, 3, 7, 1000] {
            assert_eq!(
                split(ReasoningFormat::Harmony, text, piece),
                parts("The user greets; reply <kindly>.", "Hello! How can I help?"),
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn harmony_preambles_and_unframed_text_are_answer() {
        let text =
            "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>final<|message|> Done.";
        assert_eq!(split(ReasoningFormat::Harmony, text, 4), parts("", "Let me look. Done."));
        // A model that ignores the framing still gets its text shown.
        assert_eq!(split(ReasoningFormat::Harmony, "Plain <b>answer</b>.", 3), parts("", "Plain <b>answer</b>."));
        // Cut short inside the reasoning: what was thought is still reasoning.
        assert_eq!(split(ReasoningFormat::Harmony, "<|channel|>analysis<|message|>Hmm, <|e", 2), parts("Hmm, <|e", ""));
    }

    #[test]
    fn think_tags_split_reasoning_from_the_answer() {
        let text = "<think>\nTwo and two: four.\n</think>\n\nFour.";
        for piece in [1, 2, 5, 1000] {
            assert_eq!(
                split(ReasoningFormat::Think, text, piece),
                parts("Two and two: four.\n", "Four."),
                "pieces of {piece}"
            );
        }
        assert_eq!(split(ReasoningFormat::Think, "No tags <think> here.", 2), parts("", "No tags <think> here."));
        assert_eq!(split(ReasoningFormat::Think, "<thi", 1), parts("", "<thi"));
        // A prompt that opened the reasoning: the reply starts inside it.
        let opened = ReasoningFormat::Think.after("<|im_start|>assistant\n<think>\n");
        assert_eq!(opened, ReasoningFormat::ThinkOpened);
        assert_eq!(split(opened, "Hmm.\n</think>\n\nYes.", 3), parts("Hmm.\n", "Yes."));
        assert_eq!(ReasoningFormat::Think.after("<|im_start|>assistant\n"), ReasoningFormat::Think);
    }

    #[test]
    fn the_format_comes_from_the_vocabulary() {
        let harmony = ["<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>"];
        assert_eq!(ReasoningFormat::of_vocabulary(|t| harmony.contains(&t)), ReasoningFormat::Harmony);
        assert_eq!(ReasoningFormat::of_vocabulary(|t| ["<think>", "</think>"].contains(&t)), ReasoningFormat::Think);
        assert_eq!(ReasoningFormat::of_vocabulary(|t| t == "<|end|>"), ReasoningFormat::None);
    }
}
