//! `hillside chat` and `hillside generate`: stream a reply to the terminal.

use crate::{ChatArgs, GenerateArgs};
use anyhow::Result;
use hillside_common::load_engine;
use hillside_engine::{
    generate, CancelFlag, ChatMessage, Engine, Event, GenerateParams, ReasoningFormat, Sequence, Summary,
};
use hillside_remote::RemoteEngine;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

/// The generation Ctrl-C should stop; with none running, Ctrl-C quits.
static INTERRUPTIBLE: Mutex<Option<CancelFlag>> = Mutex::new(None);

/// Ctrl-C stops the reply being written (like llama.cpp's and Ollama's chats), or quits at the prompt.
fn install_interrupt_handler() -> Result<()> {
    ctrlc::set_handler(|| match INTERRUPTIBLE.lock().ok().and_then(|g| g.clone()) {
        Some(flag) => flag.cancel(),
        None => std::process::exit(130),
    })?;
    Ok(())
}

/// Prompts longer than this get a progress bar while they are read.
const PREFILL_BAR_MIN_TOKENS: usize = 256;

/// Generates into stdout, with a prefill progress bar and a speed line on stderr.
fn stream_reply(
    engine: &Engine,
    seq: &mut Sequence,
    prompt: &[u32],
    params: &GenerateParams,
) -> Result<(String, Summary)> {
    let mut reply = String::new();
    let mut bar: Option<ProgressBar> = None;
    let mut stdout = std::io::stdout();
    let mut on_event = |event: Event| match event {
        Event::Prefill { done_tokens, total_tokens } => {
            if total_tokens - done_tokens >= PREFILL_BAR_MIN_TOKENS && bar.is_none() {
                let b = ProgressBar::new(total_tokens as u64).with_message("reading prompt");
                b.set_style(
                    ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} tokens ({per_sec})")
                        .expect("valid template"),
                );
                bar = Some(b);
            }
            if let Some(b) = &bar {
                b.set_position(done_tokens as u64);
            }
        }
        // Reasoning goes dimmed to stderr: stdout and the history keep the answer alone.
        Event::Reasoning(delta) => {
            if let Some(b) = bar.take() {
                b.finish_and_clear();
            }
            eprint!("\x1b[2m{delta}\x1b[0m");
        }
        Event::Text(delta) => {
            if let Some(b) = bar.take() {
                b.finish_and_clear();
            }
            reply.push_str(&delta);
            // A closed stdout (a pipe whose reader left) is not worth failing the reply for.
            let _ = stdout.write_all(delta.as_bytes()).and_then(|_| stdout.flush());
        }
        Event::Logprob(_) => {}
    };
    let cancel = CancelFlag::default();
    *INTERRUPTIBLE.lock().expect("interrupt slot") = Some(cancel.clone());
    let summary = generate(engine, seq, prompt, params, &cancel, &mut on_event);
    *INTERRUPTIBLE.lock().expect("interrupt slot") = None;
    let summary = summary?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    println!();
    eprintln!(
        "[{} prompt tokens ({} cached), {:.1} tok/s · {} tokens, {:.1} tok/s · {:?}]",
        summary.prompt_tokens,
        summary.reused_tokens,
        summary.prefill_tokens_per_s(),
        summary.completion_tokens,
        summary.decode_tokens_per_s(),
        summary.finish_reason,
    );
    Ok((reply, summary))
}

pub fn generate_once(args: &GenerateArgs) -> Result<()> {
    let engine = load_engine(&args.model)?;
    let prompt = if args.raw {
        engine.tokenizer().encode(&args.prompt)?
    } else {
        engine.chat_prompt(&[ChatMessage::new("user", args.prompt.as_str())])?
    };
    let mut seq = args.model.new_sequence(&engine)?;
    let reasoning = if args.raw { ReasoningFormat::None } else { engine.tokenizer().reasoning_format_after(&prompt) };
    stream_reply(&engine, &mut seq, &prompt, &GenerateParams { reasoning, ..args.sampling.params() })?;
    Ok(())
}

/// Where `hillside chat` sends each turn.
enum Chatting {
    /// The local engine, with the conversation's sequence (its cached prefix is reused, so each
    /// turn reads only the new message).
    Local {
        // Boxed: the engine is large, the remote arm a pointer.
        engine: Box<Engine>,
        seq: Sequence,
    },
    Remote(Arc<RemoteEngine>),
}

impl Chatting {
    fn name(&self) -> String {
        match self {
            Chatting::Local { engine, .. } => engine.model().config.architecture.name().to_string(),
            Chatting::Remote(remote) => format!("{} on {}", remote.model(), remote.url()),
        }
    }

    /// Streams the reply to `messages` into stdout.
    fn reply(&mut self, messages: &[ChatMessage], params: &GenerateParams) -> Result<String> {
        match self {
            Chatting::Local { engine, seq } => {
                let prompt = engine.chat_prompt(messages)?;
                let params =
                    GenerateParams { reasoning: engine.tokenizer().reasoning_format_after(&prompt), ..params.clone() };
                Ok(stream_reply(engine, seq, &prompt, &params)?.0)
            }
            Chatting::Remote(remote) => {
                let (mut reply, mut stdout) = (String::new(), std::io::stdout());
                let cancel = CancelFlag::default();
                *INTERRUPTIBLE.lock().expect("interrupt slot") = Some(cancel.clone());
                let mut sink = |text: &str| {
                    reply.push_str(text);
                    let _ = stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush());
                    !cancel.is_cancelled()
                };
                let summary = remote.chat(messages, params, &mut sink);
                *INTERRUPTIBLE.lock().expect("interrupt slot") = None;
                let summary = summary?;
                println!();
                eprintln!(
                    "[{} prompt tokens ({} cached), first token after {:.0} ms · {} tokens · {:?}]",
                    summary.prompt_tokens,
                    summary.reused_tokens,
                    summary.prefill_ms,
                    summary.completion_tokens,
                    summary.finish_reason
                );
                Ok(reply)
            }
        }
    }
}

pub fn chat(args: &ChatArgs) -> Result<()> {
    let mut chatting = match args.engine.connect()? {
        Some(remote) => Chatting::Remote(remote),
        None => {
            let engine = load_engine(&args.model)?;
            let seq = args.model.new_sequence(&engine)?;
            Chatting::Local { engine: Box::new(engine), seq }
        }
    };
    install_interrupt_handler()?;
    let params = args.sampling.params();
    let system: Vec<ChatMessage> = args.system.iter().map(|s| ChatMessage::new("system", s.as_str())).collect();
    let mut messages = system.clone();
    eprintln!("Hillside chat · {} · Ctrl-C stops a reply, /reset starts over, /exit quits", chatting.name());
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line?;
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = system.clone();
                eprintln!("(conversation cleared)");
                continue;
            }
            "/help" => {
                eprintln!("/reset  start a new conversation\n/exit   quit (or Ctrl-D)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", input));
        match chatting.reply(&messages, &params) {
            Ok(reply) => messages.push(ChatMessage::new("assistant", reply)),
            Err(e) => {
                messages.pop();
                eprintln!("error: {e:#}\n(type /reset to start a new conversation)");
            }
        }
    }
    Ok(())
}
