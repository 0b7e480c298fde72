//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template` or
//! `tokenizer_config.json`) rendered with minijinja; where a model has none, Gemma's turns for a
//! vocabulary that has them (base Gemma files carry no template), else ChatML.

use crate::error::{Error, Result};
use minijinja::{context, Environment, ErrorKind};
use serde::{Deserialize, Serialize};

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma's turns (a system message opens the first user turn, as Gemma's own template does).
const GEMMA: &str = "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<start_of_turn>user\n' + message['content'] + '\n\n' }}{% else %}{% if message['role'] == 'user' and not (loop.index0 == 1 and messages[0]['role'] == 'system') %}{{ '<start_of_turn>user\n' }}{% elif message['role'] != 'user' %}{{ '<start_of_turn>model\n' }}{% endif %}{{ message['content'] + '<end_of_turn>\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// The template to use for a model without one of its own, by whether its vocabulary has
/// Gemma's turn markers.
pub fn fallback_template(has_gemma_turns: bool) -> &'static str {
    if has_gemma_turns {
        GEMMA
    } else {
        CHATML
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self { role: role.to_string(), content: content.into() }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// `source` is the model's template; `None` uses ChatML.
    pub fn new(source: Option<&str>, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        // As Hugging Face renders chat templates (and so as their authors test them).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.unwrap_or(CHATML).to_string())
            .map_err(|e| Error::ChatTemplate(e.to_string()))?;
        Ok(Self { env, bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// The prompt text for `messages`, ending with the assistant's turn opener when asked.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template("chat").map_err(|e| Error::ChatTemplate(e.to_string()))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| Error::ChatTemplate(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback_renders_roles_and_generation_prompt() {
        let t = ChatTemplate::new(None, "", "").unwrap();
        let text = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn gemma_fallback_renders_turns_with_the_system_message_in_the_first_user_turn() {
        let t = ChatTemplate::new(Some(fallback_template(true)), "<bos>", "<eos>").unwrap();
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("user", "Bye"),
        ];
        assert_eq!(
            t.render(&messages, true).unwrap(),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn template_errors_are_reported_not_panicked() {
        let t = ChatTemplate::new(Some("{{ raise_exception('no system role') }}"), "", "").unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
        assert!(ChatTemplate::new(Some("{% for %}"), "", "").is_err());
    }
}
