//! `hillside chat` and `hillside generate`: stream a reply to the terminal, from the local engine
//! or a remote one, through the same front as the server's routes.

use crate::{local_front, ChatArgs, GenerateArgs};
use anyhow::Result;
use hillside_engine::{CancelFlag, ChatMessage, Event, GenerateParams};
use hillside_front::{EngineFront, Request};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, Write};
use std::sync::Mutex;

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

/// Generates into stdout, with a prefill progress bar (the local engine's), reasoning dimmed on
/// stderr, and a speed line on stderr; the reply's text.
fn stream_reply(front: &EngineFront, request: Request, params: &GenerateParams) -> Result<String> {
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
    let stop = CancelFlag::default();
    *INTERRUPTIBLE.lock().expect("interrupt slot") = Some(stop.clone());
    let summary = front.generate(request, params.clone(), &stop, &mut on_event);
    *INTERRUPTIBLE.lock().expect("interrupt slot") = None;
    let summary = summary?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    println!();
    // A remote engine's prompt is read before its first token arrives: its wait is the figure.
    let prompt_speed = match front.local() {
        Some(_) => format!("{:.1} tok/s", summary.prefill_tokens_per_s()),
        None => format!("first token after {:.0} ms", summary.prefill_ms),
    };
    eprintln!(
        "[{} prompt tokens ({} cached), {prompt_speed} · {} tokens, {:.1} tok/s · {:?}]",
        summary.prompt_tokens,
        summary.reused_tokens,
        summary.completion_tokens,
        summary.decode_tokens_per_s(),
        summary.finish_reason,
    );
    Ok(reply)
}

pub fn generate_once(args: &GenerateArgs) -> Result<()> {
    let front = local_front(&args.model, 1, 0)?;
    let request = if args.raw {
        front.text_request(args.prompt.clone(), true)?
    } else {
        front.chat_request(vec![ChatMessage::new("user", args.prompt.as_str())])?
    };
    stream_reply(&front, request, &args.sampling.params())?;
    Ok(())
}

pub fn chat(args: &ChatArgs) -> Result<()> {
    // Locally, the last turn's sequence is kept, so that each turn reads only its new message.
    let front = match args.engine.connect()? {
        Some(remote) => EngineFront::Remote(remote),
        None => local_front(&args.model, 1, 1)?,
    };
    install_interrupt_handler()?;
    let params = args.sampling.params();
    let system: Vec<ChatMessage> = args.system.iter().map(|s| ChatMessage::new("system", s.as_str())).collect();
    let mut messages = system.clone();
    let model = match &front {
        EngineFront::Local { engine, .. } => engine.model().config.architecture.name().to_string(),
        EngineFront::Remote(remote) => format!("{} on {}", remote.model(), remote.url()),
    };
    eprintln!("Hillside chat · {model} · Ctrl-C stops a reply, /reset starts over, /exit quits");
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
        let reply = front.chat_request(messages.clone()).map_err(anyhow::Error::from);
        match reply.and_then(|request| stream_reply(&front, request, &params)) {
            Ok(reply) => messages.push(ChatMessage::new("assistant", reply)),
            Err(e) => {
                messages.pop();
                eprintln!("error: {e:#}\n(type /reset to start a new conversation)");
            }
        }
    }
    Ok(())
}
