//! Tessera engine: loads Llama-family models (GGUF files, HF safetensors checkpoints),
//! tokenizes, generates, and batches many requests.
//!
//! - Loading: [`open`] takes a GGUF file ([`gguf`]) or an HF checkpoint ([`hf`]); both
//!   are [`weights::WeightSource`]s, so the model builder ([`llama`]) does not care
//!   which. Every layer is a [`linear::Linear`] over its stored format.
//! - Text: [`tokenizer`] (GGUF vocabularies and `tokenizer.json` through the
//!   `tokenizers` crate) and [`chat`] (the model's own Jinja template via `minijinja`).
//! - One sequence: [`generate`] (sampling, stop strings) and [`score`] (perplexity).
//! - Many sequences: [`scheduler`] (continuous batching, chunked prefill, preemption)
//!   over a paged [`kv_cache`] whose blocks [`block_manager`] counts and caches by
//!   prefix; [`structured`] constrains output to a grammar.
//! - [`profile`] records each kernel call's time against its cost model; [`pull`]
//!   fetches the default model into the cache.

#![warn(missing_docs)]

use std::path::Path;

pub mod block_manager;
pub mod chat;
pub mod generate;
pub mod gguf;
pub mod hf;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod profile;
pub mod pull;
pub mod rope_scaling;
pub mod scheduler;
pub mod score;
pub mod structured;
pub mod tokenizer;
pub mod weights;

/// Engine errors: every bad file, request or setting becomes one of these, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("gguf: {0}")]
    /// A malformed or inconsistent GGUF file.
    Gguf(String),
    #[error("model: {0}")]
    /// A model whose configuration or weights do not fit together.
    Model(String),
    #[error("{detail}")]
    /// A generation request the engine refuses: the [`scheduler::GenRequest`] field at
    /// fault (`prompt`, `max_tokens`, `sampling`, `stop`, `logprobs`, `grammar`), so a
    /// server can name its own, and why.
    Request {
        /// The request field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    #[error("tokenizer: {0}")]
    /// A tokenizer that cannot be built or used.
    Tokenizer(String),
    #[error("io: {0}")]
    /// A file or directory that cannot be read as a model.
    Io(String),
    #[error(transparent)]
    /// A kernel refused its arguments.
    Core(#[from] tessera_core::Error),
}

/// The engine's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Shorthand for [`Error::Request`].
    pub fn request(field: &'static str, detail: impl Into<String>) -> Self {
        Error::Request {
            field,
            detail: detail.into(),
        }
    }
}

/// Opens a model and its tokenizer: a GGUF file, or an HF checkpoint directory (a path
/// to a file inside one, such as its `model.safetensors`, works too).
pub fn open(
    path: &Path,
    opts: &weights::LoadOptions,
) -> Result<(llama::Llama, tokenizer::Tokenizer)> {
    let dir = match path.is_file() && !hf::is_checkpoint(path) {
        true if path
            .extension()
            .is_some_and(|e| e == "safetensors" || e == "json") =>
        {
            path.parent().unwrap_or(Path::new("."))
        }
        _ => path,
    };
    if hf::is_checkpoint(dir) {
        return open_checkpoint(dir, opts);
    }
    if path.is_dir() {
        return Err(Error::Io(format!(
            "{} is a directory without config.json: an HF checkpoint needs config.json, \
             *.safetensors and tokenizer.json; a GGUF model is one file",
            path.display()
        )));
    }
    if path.exists() && !path.is_file() {
        return Err(Error::Io(format!(
            "{} is not a regular file (models are read from files, not pipes or devices)",
            path.display()
        )));
    }
    let g = gguf::Gguf::open(path)?;
    let model = llama::Llama::from_source(llama::Config::from_gguf(&g)?, &g, opts)?;
    fits(model, tokenizer::Tokenizer::from_gguf(&g)?)
}

fn open_checkpoint(
    dir: &Path,
    opts: &weights::LoadOptions,
) -> Result<(llama::Llama, tokenizer::Tokenizer)> {
    let ck = hf::HfCheckpoint::open(dir)?;
    let model = llama::Llama::from_source(ck.config.clone(), &ck, opts)?;
    fits(model, tokenizer::Tokenizer::from_hf_dir(dir)?)
}

/// A tokenizer with more tokens than the embedding has rows would hand the model ids it
/// has no row for. Fewer is legal: checkpoints pad the embedding (Qwen2 to a multiple of
/// 128), and those rows are never produced by the tokenizer.
fn fits(
    model: llama::Llama,
    tok: tokenizer::Tokenizer,
) -> Result<(llama::Llama, tokenizer::Tokenizer)> {
    if tok.vocab_size() > model.cfg.vocab {
        return Err(Error::Model(format!(
            "the tokenizer has {} tokens but the embedding only {} rows",
            tok.vocab_size(),
            model.cfg.vocab
        )));
    }
    Ok((model, tok))
}
