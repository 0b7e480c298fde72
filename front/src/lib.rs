//! The engine a program runs on, behind one front: Hillside's own, whose scheduler batches the
//! requests, or an OpenAI-compatible one elsewhere (vLLM, llama.cpp's server), for when one
//! machine is not enough. Chat, completions, documents, the CLI and the bench ask the front
//! what they need (a prompt in the form its engine takes, a text's tokens, the context, a reply
//! run to its end) instead of each deciding again which engine it has. The few places that show
//! the local engine's insides (KV tiers, sequences, token ids) ask for them with
//! [`EngineFront::local`], and say plainly that a remote engine has none.

use hillside_engine::scheduler::{KeptPrefix, Scheduler, SchedulerConfig, SubmitError, Update};
use hillside_engine::{CancelFlag, ChatMessage, Engine, Event, GenerateParams, ReasoningFormat, Summary};
use hillside_remote::{RemoteEngine, RemoteError, ReplySink};
use std::sync::Arc;

pub enum EngineFront {
    /// Hillside's own engine, through its scheduler.
    Local { engine: Arc<Engine>, scheduler: Scheduler },
    /// An OpenAI-compatible engine elsewhere.
    Remote(Arc<RemoteEngine>),
}

/// A prompt in the form the front's engine takes.
pub enum Request {
    /// The prompt's tokens, with the K/V of its document prefix where it is kept, and how the
    /// model marks reasoning in its reply (a chat prompt's template may open a `<think>`; a
    /// raw text continued as it is has none).
    Local {
        tokens: Vec<u32>,
        prefix: Option<Box<dyn KeptPrefix>>,
        reasoning: ReasoningFormat,
    },
    Remote(RemotePrompt),
}

/// What a remote engine is asked.
pub enum RemotePrompt {
    /// Messages, for the remote's chat template.
    Chat(Vec<ChatMessage>),
    /// A text the remote continues without a template.
    Text(String),
}

impl RemotePrompt {
    /// Streams `remote`'s reply into `sink`.
    pub fn run(
        &self,
        remote: &RemoteEngine,
        params: &GenerateParams,
        sink: &mut dyn ReplySink,
    ) -> Result<Summary, RemoteError> {
        match self {
            RemotePrompt::Chat(messages) => remote.chat(messages, params, sink),
            RemotePrompt::Text(text) => remote.complete(text, params, sink),
        }
    }
}

/// A local prompt's tokens, with the K/V of its document prefix where it is kept.
pub type LocalPrompt = (Vec<u32>, Option<Box<dyn KeptPrefix>>);

impl Request {
    /// The tokens and kept prefix of a request for the local engine.
    pub fn into_local(self) -> Option<LocalPrompt> {
        match self {
            Request::Local { tokens, prefix, .. } => Some((tokens, prefix)),
            Request::Remote(_) => None,
        }
    }
}

/// Why a reply did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    #[error(transparent)]
    Engine(#[from] hillside_engine::Error),
    #[error(transparent)]
    Refused(#[from] SubmitError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("the engine stopped before the reply ended")]
    Stopped,
    /// A request made for one kind of engine reached the other (a bug).
    #[error("a request for the {0} engine reached the other one")]
    WrongEngine(&'static str),
}

impl EngineFront {
    /// Hillside's own `engine`, with a scheduler of its own.
    pub fn start_local(engine: Arc<Engine>, config: SchedulerConfig) -> Self {
        Self::Local { scheduler: Scheduler::start(engine.clone(), config), engine }
    }

    /// `local`, or `openai:URL`, as `--engine` takes it.
    pub fn name(&self) -> String {
        match self {
            Self::Local { .. } => "local".into(),
            Self::Remote(remote) => format!("openai:{}", remote.url()),
        }
    }

    /// The local engine and its scheduler; `None` on a remote engine.
    pub fn local(&self) -> Option<(&Arc<Engine>, &Scheduler)> {
        match self {
            Self::Local { engine, scheduler } => Some((engine, scheduler)),
            Self::Remote(_) => None,
        }
    }

    /// The remote engine; `None` on the local one.
    pub fn remote(&self) -> Option<&Arc<RemoteEngine>> {
        match self {
            Self::Local { .. } => None,
            Self::Remote(remote) => Some(remote),
        }
    }

    /// Each sequence's context in tokens: on the local engine `setting` (the scheduler's, or the
    /// model's own where it has none), cut to what the model takes; on a remote one, each
    /// request's.
    pub fn context_tokens(&self, setting: Option<usize>) -> usize {
        match self {
            Self::Local { engine, .. } => {
                let model = engine.model();
                model.kv_shape(setting.unwrap_or(model.config.context_tokens)).max_tokens
            }
            Self::Remote(remote) => remote.context_tokens(),
        }
    }

    /// The tokens of `text` by the model's own tokenizer (a remote's where it offers one, else
    /// an estimate).
    pub fn count_tokens(&self, text: &str) -> usize {
        match self {
            Self::Local { engine, .. } => count_local_tokens(engine, text),
            Self::Remote(remote) => remote.count_tokens(text),
        }
    }

    /// `messages` as a prompt for this front's engine: through the model's chat template
    /// locally, as they are for a remote (which applies its own).
    pub fn chat_request(&self, messages: Vec<ChatMessage>) -> hillside_engine::Result<Request> {
        match self {
            Self::Local { engine, .. } => {
                let tokens = engine.chat_prompt(&messages)?;
                let reasoning = engine.tokenizer().reasoning_format_after(&tokens);
                Ok(Request::Local { tokens, prefix: None, reasoning })
            }
            Self::Remote(_) => Ok(Request::Remote(RemotePrompt::Chat(messages))),
        }
    }

    /// `text` to continue without a chat template: its tokens locally (with special tokens
    /// read as such where `parse_special`), the text itself for a remote.
    pub fn text_request(&self, text: String, parse_special: bool) -> hillside_engine::Result<Request> {
        match self {
            Self::Local { engine, .. } => {
                let tokenizer = engine.tokenizer();
                let tokens = if parse_special { tokenizer.encode(&text)? } else { tokenizer.encode_text(&text)? };
                Ok(Request::Local { tokens, prefix: None, reasoning: ReasoningFormat::None })
            }
            Self::Remote(_) => Ok(Request::Remote(RemotePrompt::Text(text))),
        }
    }

    /// Token ids to continue: only the local engine takes them (a remote's vocabulary is not
    /// known here); `Err` says why they are refused.
    pub fn token_request(&self, tokens: Vec<u32>) -> Result<Request, String> {
        let Self::Local { engine, .. } = self else {
            return Err(
                "token ids are not accepted: this server runs on a remote engine, whose vocabulary it does not hold"
                    .into(),
            );
        };
        let vocab = engine.model().config.vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(bad) => Err(format!("token id {bad} is outside the vocabulary ({vocab})")),
            None => Ok(Request::Local { tokens, prefix: None, reasoning: ReasoningFormat::None }),
        }
    }

    /// Whether replies can come with their tokens' log-probabilities (the local engine's only).
    pub fn gives_logprobs(&self) -> bool {
        matches!(self, Self::Local { .. })
    }

    /// The tokens a remote prompt takes: its text counted by the remote's tokenizer (its own
    /// template adds a few). A local prompt's are its tokens.
    pub fn remote_prompt_tokens(&self, prompt: &RemotePrompt) -> usize {
        match prompt {
            RemotePrompt::Chat(messages) => {
                let text: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
                self.count_tokens(&text.join("\n")).max(1)
            }
            RemotePrompt::Text(text) => self.count_tokens(text),
        }
    }

    /// Whether the engine answers now: the local one always; a remote one when it lists its
    /// models.
    pub fn reachable(&self) -> Result<(), RemoteError> {
        match self {
            Self::Local { .. } => Ok(()),
            Self::Remote(remote) => remote.reachable(),
        }
    }

    /// Runs `request` to its end on the calling thread, handing each event to `on_event` (from a
    /// remote engine only its text and reasoning: its prompt's progress is not seen here).
    /// Once `stop` is set the reply ends early, as a cancelled one, with what it had written.
    pub fn generate(
        &self,
        request: Request,
        params: GenerateParams,
        stop: &CancelFlag,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Summary, FrontError> {
        match (self, request) {
            (Self::Remote(remote), Request::Remote(prompt)) => {
                Ok(prompt.run(remote, &params, &mut RemoteEvents { stop, on_event })?)
            }
            (Self::Local { scheduler, .. }, Request::Local { tokens, prefix, reasoning }) => {
                let params = GenerateParams { reasoning, ..params };
                let (tx, rx) = std::sync::mpsc::channel();
                let ticket =
                    scheduler.submit_with_prefix(tokens, prefix, params, Box::new(move |u| tx.send(u).is_ok()))?;
                loop {
                    // The stop flag is looked at between updates, and at least this often.
                    match rx.recv_timeout(STOP_POLL) {
                        Ok(Update::Event(event)) => on_event(event),
                        Ok(Update::Done(done)) => return Ok(done?),
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Err(FrontError::Stopped),
                    }
                    if stop.is_cancelled() {
                        ticket.cancel();
                    }
                }
            }
            (Self::Local { .. }, Request::Remote(_)) => Err(FrontError::WrongEngine("remote")),
            (Self::Remote(_), Request::Local { .. }) => Err(FrontError::WrongEngine("local")),
        }
    }
}

/// How long [`EngineFront::generate`] waits for an update before it looks at its stop flag.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// A remote reply's pieces as the local engine's events.
struct RemoteEvents<'a> {
    stop: &'a CancelFlag,
    on_event: &'a mut dyn FnMut(Event),
}

impl ReplySink for RemoteEvents<'_> {
    fn text(&mut self, text: &str) -> bool {
        (self.on_event)(Event::Text(text.to_string()));
        !self.stop.is_cancelled()
    }

    fn reasoning(&mut self, text: &str) -> bool {
        (self.on_event)(Event::Reasoning(text.to_string()));
        !self.stop.is_cancelled()
    }
}

/// The tokens of `text` by the local model's tokenizer (a quarter of its bytes where it cannot
/// encode the text).
pub fn count_local_tokens(engine: &Engine, text: &str) -> usize {
    engine.tokenizer().encode_text(text).map_or(text.len() / 4, |t| t.len())
}
