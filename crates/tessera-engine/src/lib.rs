//! Tessera engine: loads Llama-family models from GGUF, tokenizes, generates.

pub mod generate;
pub mod gguf;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod pull;
pub mod score;
pub mod tokenizer;

/// Engine errors: every bad file, request or setting becomes one of these, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("gguf: {0}")]
    Gguf(String),
    #[error("model: {0}")]
    Model(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("io: {0}")]
    Io(String),
    #[error(transparent)]
    Core(#[from] tessera_core::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
