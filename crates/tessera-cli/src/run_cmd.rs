//! `tessera run` (generate text), `tessera score` (teacher-forced log-probabilities),
//! `tessera bench-model` (prefill/decode rates) and `tessera pull` (fetch the default model).

use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use tessera_engine::generate::{generate, Request, Sampling};
use tessera_engine::kv_cache::KvDtype;
use tessera_engine::linear::Activations;
use tessera_engine::llama::Llama;
use tessera_engine::pull;
use tessera_engine::tokenizer::Tokenizer;
use tessera_engine::weights::{parse_quantize, LoadOptions};

/// Which model to load, and how.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file or a Hugging Face checkpoint directory (config.json, *.safetensors,
    /// tokenizer.json); default: the default model, pulled on first use.
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    /// Re-encode float weights at load: q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k,
    /// q5_k, q6_k, int4_g32, int4_g64, int4_g128, i8 (per-channel INT8), f8e4m3 or
    /// f8e5m2 (FP8, per-channel scales). A matrix whose rows are not whole blocks takes
    /// the nearest format that fits, as llama.cpp does for K-quants; the load line lists
    /// the formats used.
    #[arg(long)]
    quantize: Option<String>,
    /// Activations of matmuls up to 64 rows (decode, batching steps) over block-format
    /// weights: a16 rounds each 32 values to 16 bits (a step of 1/64 770 of their
    /// largest, finer than the f16 KV cache) and runs the integer kernels on two 8-bit
    /// planes (default-model decode 312–326 against f32's 131–148 tok/s on an Intel
    /// AVX-512 host, docs/performance.md); the second plane doubles the integer work,
    /// which a batch of many streams no longer hides behind weight reads (16 streams
    /// on an AMD Zen 3 AVX2 host: 374–415 tok/s against int8's 585–667,
    /// docs/performance.md); f32 is exact; int8 is --int8-acts [default: a16]
    #[arg(long, value_parser = ["a16", "f32", "int8"])]
    acts: Option<String>,
    /// --acts int8: 8-bit activations and integer dot products, as llama.cpp does, also
    /// for prefill where that is faster than f32 (Q4_0, Q4_1, Q4_K, 4-bit groups).
    /// The fastest decode; perplexity moves by about 1%, and greedy text can change
    /// where two tokens nearly tie (docs/performance.md)
    #[arg(long, conflicts_with = "acts")]
    int8_acts: bool,
    /// Packed weights in 2 MiB pages (Linux transparent huge pages, asked for with
    /// madvise): decode 6–14% faster on an Intel AVX-512 host, but where a virtual machine
    /// backs fresh memory lazily the first load there took 2.0 s, 0.22 s once the memory
    /// had been used (docs/performance.md). Default: on for `serve` and `bench-serve`, off
    /// otherwise
    #[arg(long)]
    large_pages: Option<Switch>,
}

/// A setting turned on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// Turned on.
    On,
    /// Turned off.
    Off,
}

impl ModelArgs {
    /// These arguments with `--large-pages` defaulting to `on` where not given.
    pub(crate) fn large_pages_by_default(mut self) -> Self {
        self.large_pages.get_or_insert(Switch::On);
        self
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The prompt (a user message for chat models).
    #[arg(default_value = "Write a haiku about fast kernels.")]
    prompt: String,
    #[command(flatten)]
    model: ModelArgs,
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
    /// Drop tokens below min_p × the top probability (0 = off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Penalise recently seen tokens (1 = off; 1.1 is typical).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Subtract this from a recent token's logit per occurrence (OpenAI's; -2..2, 0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Subtract this once from every recent token's logit (OpenAI's; -2..2, 0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop before this string (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Use the prompt as raw text instead of wrapping it in the chat template.
    #[arg(long, conflicts_with = "chat")]
    raw: bool,
    /// Wrap the prompt in the model's chat template (the default when it has one).
    #[arg(long)]
    chat: bool,
    /// Print one JSON object (prompt and generated ids, text, timings) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Generate past end-of-sequence tokens (for measurements).
    #[arg(long)]
    ignore_eos: bool,
    /// KV cache storage: f16 (half the attention traffic), f32 (exact) or q8 (int8 codes
    /// with a scale per position and head: a quarter of f32's bytes, opt-in numerics)
    /// [default: f16; on a --device, f32, the one it holds]
    #[arg(long)]
    kv_cache: Option<KvDtype>,
    /// Record every kernel call: Chrome trace JSON to this file, per-op table to stderr.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Where the forward pass runs: the CPU, or a device the binary was built for
    /// (weights uploaded once, KV cache on the device, logits back for sampling).
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::devices::DeviceArg,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["text", "file"])))]
pub struct ScoreArgs {
    /// The text to score (raw, no chat template).
    #[arg(long)]
    text: Option<String>,
    /// Read the text to score from this file instead.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Score as llama.cpp's `llama-perplexity -c N` does: chunks of N tokens, each from
    /// an empty cache, counting the second half of each; prints the running perplexity
    /// after every chunk (at most --chunks of them).
    #[arg(long)]
    ctx: Option<usize>,
    /// With --ctx: chunks to score at most (default: all whole chunks).
    #[arg(long, requires = "ctx")]
    chunks: Option<usize>,
    #[command(flatten)]
    model: ModelArgs,
    /// Alternatives to list per position.
    #[arg(long, default_value_t = 5)]
    top_k: usize,
    /// Print JSON (else a table).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct BenchModelArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Profile the last run: Chrome trace JSON to this file, per-op table to stderr.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// KV cache storage: f16, f32 or q8.
    #[arg(long, default_value = "f16")]
    kv_cache: KvDtype,
    /// Print one JSON object (rates of every run, medians, host CPU, ISA, threads).
    #[arg(long)]
    json: bool,
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

/// Opens a model (the default one, pulled on first use, when no path is given).
pub(crate) fn load(a: ModelArgs) -> Result<(Llama, Tokenizer)> {
    let activations = match (a.int8_acts, &a.acts) {
        (true, _) => Activations::Int8,
        (false, Some(name)) => Activations::parse(name)?,
        (false, None) => Activations::default(),
    };
    load_with(a, activations)
}

/// [`load`] for a device forward: the matmuls run on the device with f32 activations,
/// so the blocks stay as stored (an integer mode would repack them for the CPU).
fn load_for_device(a: ModelArgs) -> Result<(Llama, Tokenizer)> {
    if a.int8_acts || a.acts.is_some() {
        anyhow::bail!(
            "--acts and --int8-acts choose the CPU kernels' activations; the device \
             kernels take f32 activations"
        );
    }
    load_with(a, Activations::F32)
}

fn load_with(a: ModelArgs, activations: Activations) -> Result<(Llama, Tokenizer)> {
    let path = match a.model {
        Some(p) => p,
        None => pull::pull(&pull::DEFAULT_MODEL, log).context("pulling the default model")?,
    };
    let opts = LoadOptions {
        quantize: a.quantize.as_deref().map(parse_quantize).transpose()?,
        activations,
        large_pages: a.large_pages == Some(Switch::On),
    };
    let t = std::time::Instant::now();
    let (model, tok) = tessera_engine::open(&path, &opts)
        .with_context(|| format!("opening {}", path.display()))?;
    let formats: Vec<String> = model
        .weight_formats()
        .iter()
        .map(|(d, n, b)| format!("{n} {d} ({:.1} MiB)", *b as f64 / (1 << 20) as f64))
        .collect();
    // Said where asked for: the OS may still back them with small pages (THP off).
    let placed = match opts.large_pages {
        true => format!(
            "; {:.1} MiB packed into 2 MiB-page chunks",
            model.large_page_bytes() as f64 / (1 << 20) as f64
        ),
        false => String::new(),
    };
    log(&format!(
        "loaded {} ({} layers, dim {}, {} heads / {} KV; matrices: {}{placed}) in {:.2} s",
        path.file_name()
            .map(|f| f.to_string_lossy())
            .unwrap_or_default(),
        model.cfg.n_layers,
        model.cfg.dim,
        model.cfg.heads,
        model.cfg.kv_heads,
        formats.join(", "),
        t.elapsed().as_secs_f64()
    ));
    Ok((model, tok))
}

pub fn run(a: RunArgs) -> Result<()> {
    if let Some(path) = &a.profile {
        crate::profile_cmd::check_writable(path)?;
    }
    let on_device = a.device.kind();
    if on_device.is_some() && a.profile.is_some() {
        anyhow::bail!("--profile records the CPU kernels' calls; it does not run with --device");
    }
    let kv_dtype = match (on_device, a.kv_cache) {
        (None, kv) => kv.unwrap_or(KvDtype::F16),
        (Some(_), None | Some(KvDtype::F32)) => KvDtype::F32,
        (Some(kind), Some(kv)) => {
            anyhow::bail!("the {kind} KV cache holds f32; --kv-cache {kv:?} is CPU-only")
        }
    };
    let (model, tok) = match on_device {
        None => load(a.model)?,
        Some(_) => load_for_device(a.model)?,
    };
    let device_model = match on_device {
        None => None,
        Some(kind) => {
            let dev = crate::devices::open_device(kind)?;
            let t = std::time::Instant::now();
            let m = tessera_engine::llama::DeviceLlama::new(&model, dev)?;
            let (blocks, dense) = m.matmul_paths();
            log(&format!(
                "uploaded to {} ({}) in {:.2} s: {blocks} matrices as blocks, {dense} as f32",
                kind,
                m.device().name(),
                t.elapsed().as_secs_f64()
            ));
            Some(m)
        }
    };
    let decoder: &dyn tessera_engine::generate::Decoder = match &device_model {
        Some(m) => m,
        None => &model,
    };
    let text = if a.raw {
        a.prompt.clone()
    } else {
        tok.chat_prompt(&a.prompt)?
    };
    let req = Request {
        prompt: tok.encode(&text)?,
        max_tokens: a.max_tokens,
        sampling: Sampling {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            repetition_penalty: a.repetition_penalty,
            frequency_penalty: a.frequency_penalty,
            presence_penalty: a.presence_penalty,
            seed: a.seed,
            ..Sampling::default()
        },
        stop: a.stop,
        ignore_eos: a.ignore_eos,
        kv_dtype,
    };
    tessera_engine::profile::enable(a.profile.is_some());
    let mut out = std::io::stdout();
    let stats = generate(decoder, &tok, &req, |piece| {
        if !a.json {
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    })?;
    if a.json {
        let j = serde_json::json!({
            "prompt_ids": req.prompt,
            "generated_ids": stats.generated,
            "text": stats.text,
            "finish": stats.finish,
            "prompt_tokens": stats.prompt_tokens,
            "prefill_s": stats.prefill_s,
            "decode_s": stats.decode_s,
            "prefill_tok_s": stats.prefill_tok_s(),
            "decode_tok_s": stats.decode_tok_s(),
        });
        println!("{j}");
    } else {
        println!();
    }
    log(&format!(
        "prompt {} tokens at {:.1} tok/s; generated {} tokens at {:.1} tok/s ({})",
        stats.prompt_tokens,
        stats.prefill_tok_s(),
        stats.generated.len(),
        stats.decode_tok_s(),
        stats.finish
    ));
    if let Some(path) = &a.profile {
        crate::profile_cmd::report(&tessera_engine::profile::take(), path)?;
    }
    Ok(())
}

pub fn score(a: ScoreArgs) -> Result<()> {
    let text = match (&a.text, &a.file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, None) => anyhow::bail!("give --text or --file"),
    };
    let (model, tok) = load(a.model)?;
    let ids = tok.encode(&text)?;
    if let Some(ctx) = a.ctx {
        let whole = ids.len() / ctx.max(1);
        if whole == 0 || a.chunks == Some(0) {
            anyhow::bail!(
                "--ctx {ctx} needs at least one whole chunk: the text has {} tokens{}",
                ids.len(),
                if a.chunks == Some(0) {
                    ", --chunks 0"
                } else {
                    ""
                }
            );
        }
        let ids = &ids[..a.chunks.unwrap_or(whole).min(whole) * ctx];
        let running = tessera_engine::score::chunked_perplexity(&model, ids, ctx)?;
        if a.json {
            println!(
                "{}",
                serde_json::json!({"ctx": ctx, "running_perplexity": running})
            );
        } else {
            for (i, p) in running.iter().enumerate() {
                println!("after chunk {:>3}: perplexity {p:.4}", i + 1);
            }
        }
        return Ok(());
    }
    let s = tessera_engine::score::score(&model, &ids, a.top_k)?;
    if a.json {
        let positions: Vec<_> = s
            .positions
            .iter()
            .map(|p| serde_json::json!({"next": p.next, "logprob": p.logprob, "top": p.top}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"tokens": ids, "positions": positions, "perplexity": s.perplexity})
        );
    } else {
        for (i, p) in s.positions.iter().enumerate() {
            let piece = tok.decode(&[p.next]).unwrap_or_default();
            println!("{:>5} {:>8.3} {:?}", i + 1, p.logprob, piece);
        }
        println!(
            "perplexity {:.3} over {} tokens",
            s.perplexity,
            s.positions.len()
        );
    }
    Ok(())
}

pub fn bench_model(a: BenchModelArgs) -> Result<()> {
    if let Some(path) = &a.profile {
        crate::profile_cmd::check_writable(path)?;
    }
    let (model, tok) = load(a.model)?;
    if a.prompt_tokens == 0 || a.runs == 0 || a.prompt_tokens + a.gen_tokens > model.cfg.context {
        anyhow::bail!(
            "need 1 ≤ prompt + generated tokens ≤ {} and ≥ 1 run",
            model.cfg.context
        );
    }
    // A real text, repeated to length: realistic tokens without a dataset.
    let base =
        tok.encode("The quick brown fox jumps over the lazy dog while 42 kernels run fast. ")?;
    let prompt: Vec<u32> = base.iter().cycle().take(a.prompt_tokens).copied().collect();
    let (mut pre, mut dec) = (Vec::new(), Vec::new());
    for run in 0..a.runs {
        tessera_engine::profile::enable(a.profile.is_some() && run + 1 == a.runs);
        let req = Request {
            prompt: prompt.clone(),
            max_tokens: a.gen_tokens,
            sampling: Sampling::default(),
            ignore_eos: true,
            kv_dtype: a.kv_cache,
            ..Request::default()
        };
        let s = generate(&model, &tok, &req, |_| {})?;
        pre.push(s.prefill_tok_s());
        dec.push(s.decode_tok_s());
    }
    let median = |v: &mut Vec<f64>| {
        let mut s = v.clone();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    if a.json {
        let j = serde_json::json!({
            "host": crate::bench_serve_cmd::host_label(),
            "cpu_features": tessera_core::CpuFeatures::get().summary(),
            "isa": tessera_core::Isa::best().name(),
            "threads": tessera_kernels::pool::global().threads(),
            "activations": model.activations().name(),
            "kv_cache": format!("{:?}", a.kv_cache).to_lowercase(),
            "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens,
            "prefill_tok_s": median(&mut pre),
            "decode_tok_s": median(&mut dec),
            "prefill_tok_s_runs": pre,
            "decode_tok_s_runs": dec,
        });
        println!("{j}");
    } else {
        println!(
        "prefill {} tokens: {:.1} tok/s; decode {} tokens: {:.1} tok/s (median of {} runs, {} threads)",
        a.prompt_tokens,
        median(&mut pre),
        a.gen_tokens,
        median(&mut dec),
        a.runs,
        tessera_kernels::pool::global().threads()
    );
    }
    if let Some(path) = &a.profile {
        tessera_engine::profile::enable(false);
        crate::profile_cmd::report(&tessera_engine::profile::take(), path)?;
    }
    Ok(())
}
