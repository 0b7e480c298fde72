//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template` or
//! `tokenizer_config.json`) rendered with minijinja; where a model has none, Gemma's turns for a
//! vocabulary that has them (base Gemma files carry no template), else ChatML.

use crate::error::{Error, Result};
use minijinja::{context, Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

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
        // Templates that date their system message (gpt-oss's, Llama 3's) ask for today.
        env.add_function("strftime_now", |format: String| {
            let now_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            strftime(&format, now_s)
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

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/// `format` with C's `strftime` directives filled in for `unix_s` seconds, in UTC: the date and
/// time ones (`%Y %y %m %d %e %B %b %A %a %H %M %S %%`); any other is left as written.
pub fn strftime(format: &str, unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    let second_of_day = unix_s % 86_400;
    let weekday = WEEKDAYS[(days + 4).rem_euclid(7) as usize]; // 1970-01-01 was a Thursday
    let month_name = MONTHS[month as usize - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('y') => out += &format!("{:02}", year.rem_euclid(100)),
            Some('m') => out += &format!("{month:02}"),
            Some('d') => out += &format!("{day:02}"),
            Some('e') => out += &format!("{day:2}"),
            Some('B') => out += month_name,
            Some('b') => out += &month_name[..3],
            Some('A') => out += weekday,
            Some('a') => out += &weekday[..3],
            Some('H') => out += &format!("{:02}", second_of_day / 3600),
            Some('M') => out += &format!("{:02}", second_of_day / 60 % 60),
            Some('S') => out += &format!("{:02}", second_of_day % 60),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month, day) of the civil date `days` after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 } as u32;
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_fills_in_dates_as_c_does() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", 1_709_211_909), "2024-02-29 13:05:09");
        assert_eq!(
            strftime("%d %b %Y (%a, %B %e), 100%% %Q", 1_709_211_909),
            "29 Feb 2024 (Thu, February 29), 100% %Q"
        );
        assert_eq!(strftime("%Y-%m-%d %A", 0), "1970-01-01 Thursday");
        assert_eq!(strftime("%y/%m/%d", 4_102_444_800), "00/01/01"); // 2100-01-01
    }

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
