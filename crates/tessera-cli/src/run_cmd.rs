//! `tessera run` (generate text) and `tessera pull` (fetch the default model).

use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use tessera_engine::generate::{generate, Sampling};
use tessera_engine::gguf::Gguf;
use tessera_engine::llama::Llama;
use tessera_engine::pull;
use tessera_engine::tokenizer::Tokenizer;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The prompt (a user message for chat models).
    #[arg(default_value = "Write a haiku about fast kernels.")]
    prompt: String,
    /// A GGUF file (default: the default model, pulled on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens to generate at most.
    #[arg(long, short = 'n', default_value_t = 128)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Use the prompt as raw text instead of wrapping it in the chat template.
    #[arg(long)]
    raw: bool,
}

#[derive(Args, Debug)]
pub struct PullArgs {
    /// Model name (default: the default model).
    name: Option<String>,
}

fn log(line: &str) {
    eprintln!("tessera: {line}");
}

pub fn pull(a: PullArgs) -> Result<()> {
    let m = pull::find(a.name.as_deref())?;
    let path = pull::pull(&m, log)?;
    println!("{}", path.display());
    Ok(())
}

pub fn run(a: RunArgs) -> Result<()> {
    let path = match a.model {
        Some(p) => p,
        None => pull::pull(&pull::DEFAULT_MODEL, log).context("pulling the default model")?,
    };
    let t = std::time::Instant::now();
    let gguf = Gguf::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let model = Llama::load(&gguf)?;
    let tok = Tokenizer::from_gguf(&gguf)?;
    log(&format!(
        "loaded {} ({} layers, dim {}, {} heads / {} KV) in {:.2} s",
        path.file_name()
            .map(|f| f.to_string_lossy())
            .unwrap_or_default(),
        model.cfg.n_layers,
        model.cfg.dim,
        model.cfg.heads,
        model.cfg.kv_heads,
        t.elapsed().as_secs_f64()
    ));
    let text = if a.raw {
        a.prompt.clone()
    } else {
        tok.chat_prompt(&a.prompt)
    };
    let ids = tok.encode(&text)?;
    let sampling = Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    };
    let mut out = std::io::stdout();
    let stats = generate(&model, &tok, &ids, a.max_tokens, &sampling, |piece| {
        let _ = out.write_all(piece.as_bytes());
        let _ = out.flush();
    })?;
    println!();
    log(&format!(
        "prompt {} tokens at {:.1} tok/s; generated {} tokens at {:.1} tok/s ({})",
        stats.prompt_tokens,
        stats.prefill_tok_s(),
        stats.generated.len(),
        stats.decode_tok_s(),
        stats.finish
    ));
    Ok(())
}
