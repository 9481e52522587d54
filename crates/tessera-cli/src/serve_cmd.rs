//! `tessera serve`: the OpenAI-compatible server on the batching engine.

use crate::bench_serve_cmd::BatchArgs;
use crate::run_cmd::{load, ModelArgs};
use anyhow::{Context, Result};
use clap::Args;
use std::sync::Arc;
use std::time::Duration;
use tessera_engine::scheduler::Scheduler;
use tessera_server::ServerOptions;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    batch: BatchArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 exposes the server).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* (default: no key).
    #[arg(long)]
    api_key: Option<String>,
    /// The model id clients send (default: the default model's name, else the model
    /// file's name without extension).
    #[arg(long)]
    model_name: Option<String>,
    /// Sequences and prompt scorings accepted and unfinished before new requests get 429.
    #[arg(long, default_value_t = 1024)]
    max_queue: usize,
    /// Largest request body in bytes (413 above it).
    #[arg(long, default_value_t = 4 << 20)]
    max_body: usize,
    /// Seconds a shutdown lets in-flight requests finish before cancelling them.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
}

/// Sequences `serve` runs at once unless --max-seqs says otherwise.
const DEFAULT_MAX_SEQS: usize = 16;

pub fn run(a: ServeArgs) -> Result<()> {
    if a.max_queue == 0 || a.max_body == 0 {
        anyhow::bail!("--max-queue and --max-body must be at least 1");
    }
    let name = match (&a.model_name, &a.model.model) {
        (Some(n), _) => n.clone(),
        (None, Some(p)) => p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into()),
        (None, None) => tessera_engine::pull::DEFAULT_MODEL.name.to_string(),
    };
    a.batch.check(DEFAULT_MAX_SEQS)?;
    let (model, tok) = load(a.model.clone().large_pages_by_default())?;
    let cfg = a.batch.config(&model.cfg, DEFAULT_MAX_SEQS)?;
    let sched = Scheduler::new(Arc::new(model), Arc::new(tok), cfg)?;
    let opts = ServerOptions {
        host: a.host.clone(),
        port: a.port,
        api_key: a.api_key.clone(),
        model_name: name.clone(),
        max_queue: a.max_queue,
        max_body: a.max_body,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
    };
    let server = tessera_server::spawn(sched, opts, true)
        .with_context(|| format!("starting the server on {}:{}", a.host, a.port))?;
    eprintln!(
        "tessera: serving '{name}' on http://{} (OpenAI API at /v1; /health, /metrics); Ctrl-C stops",
        server.addr
    );
    server.join()?;
    eprintln!("tessera: server stopped");
    Ok(())
}
