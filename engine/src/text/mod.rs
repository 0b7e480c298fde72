//! Text in and out of the model: tokenizer, chat template, streamed detokenization.

mod bpe;
pub mod chat;
mod controls;
pub mod reasoning;
mod spm;
pub mod stop;
pub mod stream;
pub mod tokenizer;
