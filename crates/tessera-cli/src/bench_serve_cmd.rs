//! `tessera bench-serve`: an offline throughput benchmark through the continuous-batching
//! scheduler. Requests of synthetic text keep `--concurrency` in flight (closed loop: a
//! finished request is replaced at once); every step is timed, so the report gives the
//! aggregate rates, time to first token and inter-token latency percentiles, and the
//! rates of the steps that were pure prefill or pure decode (what llama.cpp's
//! `llama-batched-bench` calls S_PP and S_TG).
//!
//! Several concurrencies (`--concurrency 1,4,16`) and `--rounds` make a sweep: the model
//! is loaded once and the levels run in turn, round after round, so each round's
//! levels are measured minutes apart at most, and each level's decode rate is also
//! given as a ratio to the first level's in the same round. On a shared host whose
//! neighbours move the rates by a third within an hour, same-round ratios are what
//! separate the engine's scaling from the host's drift.

use crate::progress;
use crate::run_cmd::{load, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tessera_engine::generate::Sampling;
use tessera_engine::kv_cache::{KvDtype, KvStore};
use tessera_engine::llama::{Config, Llama};
use tessera_engine::scheduler::{Event, GenRequest, Scheduler, SchedulerConfig, SeqId};
use tessera_engine::tokenizer::Tokenizer;
use tessera_perf::stats::quantile;

/// The scheduler's limits, shared by every command that batches.
#[derive(Args, Debug, Clone)]
pub struct BatchArgs {
    /// Most sequences running at once (default: --concurrency for bench-serve, one more
    /// with --long-prompt; 16 else).
    #[arg(long)]
    pub max_seqs: Option<usize>,
    /// Most tokens per step (decode tokens plus prompt chunks; `serve` scores an echoed
    /// prompt with what a step leaves): smaller keeps inter-token latency flat while long
    /// prompts arrive, larger prefills faster.
    #[arg(long, default_value_t = 256)]
    pub max_batch_tokens: usize,
    /// Pace prompt chunks beside decoding streams: a step takes at most F times the
    /// decode-only step of the running and waiting sequences (measured as it runs),
    /// with at least one prompt token; a prompt with no stream beside it still takes
    /// --max-batch-tokens a step. Smooth streams for slower prefill of what arrives
    /// beside them (docs/performance.md, host B: 1.5). Off by default.
    #[arg(long, value_name = "F")]
    pub itl_factor: Option<f64>,
    /// KV cache pool size, e.g. 2GiB or 512M (default: a quarter of RAM, at most what
    /// max-seqs full contexts need).
    #[arg(long)]
    pub kv_memory: Option<String>,
    /// KV cache storage: f16 (half the attention traffic), f32 (exact) or q8 (int8 codes
    /// with a scale per position and head: half of f16's bytes, opt-in numerics).
    #[arg(long, default_value = "f16")]
    pub kv_cache: KvDtype,
    /// Turn automatic prefix caching off.
    #[arg(long)]
    pub no_prefix_cache: bool,
}

impl BatchArgs {
    /// Checks what needs no model (the limits with `default_seqs` standing for an
    /// unset --max-seqs, and --kv-memory's spelling), so a bad flag is reported before
    /// a model is loaded or pulled.
    pub fn check(&self, default_seqs: usize) -> Result<()> {
        let max_seqs = self.max_seqs.unwrap_or(default_seqs);
        SchedulerConfig::check_limits(max_seqs, self.max_batch_tokens, self.itl_factor)?;
        if let Some(s) = &self.kv_memory {
            parse_size(s)?;
        }
        Ok(())
    }

    /// The scheduler configuration for `model`, with the KV pool printed to stderr.
    pub fn config(&self, model: &Config, default_seqs: usize) -> Result<SchedulerConfig> {
        let max_seqs = self.max_seqs.unwrap_or(default_seqs);
        let bytes = match &self.kv_memory {
            Some(s) => parse_size(s)?,
            None => SchedulerConfig::default_kv_bytes(model, max_seqs.max(1), self.kv_cache),
        };
        let mut c = SchedulerConfig::with_memory(
            model,
            max_seqs,
            self.max_batch_tokens,
            bytes,
            self.kv_cache,
        );
        c.prefix_caching = !self.no_prefix_cache;
        c.itl_factor = self.itl_factor;
        let block = KvStore::block_bytes(model, self.kv_cache);
        if c.kv_blocks == 0 {
            bail!(
                "--kv-memory {bytes} bytes holds no KV block ({block} bytes for {} positions)",
                tessera_engine::kv_cache::BLOCK
            );
        }
        c.validate(model)?;
        eprintln!(
            "tessera: KV cache {:.1} MiB ({} blocks of {} positions, {}; {} positions), \
             max {} sequences, {} tokens per step{}",
            (c.kv_blocks * block) as f64 / (1 << 20) as f64,
            c.kv_blocks,
            tessera_engine::kv_cache::BLOCK,
            format!("{:?}", c.kv_dtype).to_lowercase(),
            c.kv_blocks * tessera_engine::kv_cache::BLOCK,
            c.max_seqs,
            c.max_batch_tokens,
            match c.itl_factor {
                Some(f) => format!(" (prompt chunks paced to {f}× a decode step)"),
                None => String::new(),
            }
        );
        Ok(c)
    }
}

/// Parses `2GiB`, `1.5G`, `512MB`, `4096` (bytes); binary units either way.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .with_context(|| format!("size '{s}': expected a number with an optional unit"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => bail!("size '{s}': unknown unit '{u}' (B, K, M, G, T)"),
    };
    let bytes = v * mult as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > (1u64 << 50) as f64 {
        bail!("size '{s}' is out of range");
    }
    Ok(bytes as u64)
}

#[derive(Args, Debug)]
pub struct BenchServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    batch: BatchArgs,
    /// Requests in all (per concurrency level; default 4 × the level's concurrency).
    #[arg(long)]
    requests: Option<usize>,
    /// Requests in flight at once; a comma-separated list (e.g. 1,4,16) runs each in
    /// turn and reports each level's rates against the first's.
    #[arg(long, value_delimiter = ',', default_value = "16")]
    concurrency: Vec<usize>,
    /// Times to run every concurrency level, alternating levels within each round.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Prompt tokens per request (the shared prefix included).
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens generated per request (end-of-turn tokens ignored).
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Leading prompt tokens every request shares (prefix caching's case).
    #[arg(long, default_value_t = 0)]
    shared_prefix: usize,
    /// One more request with a prompt this long, added once every other running stream
    /// has its first token, with a seat of its own (the default --max-seqs is one more
    /// than --concurrency) so it prefills beside them; its latencies are reported apart
    /// from the streams'.
    #[arg(long)]
    long_prompt: Option<usize>,
    /// Print one JSON object instead of the text report.
    #[arg(long)]
    json: bool,
    /// Record every kernel call: Chrome trace JSON to this file, per-op table to stderr.
    #[arg(long)]
    profile: Option<std::path::PathBuf>,
}

/// Timings of one request.
#[derive(Debug, Default, Clone)]
struct Timing {
    added: f64,
    tokens: Vec<f64>,
    long: bool,
}

/// Synthetic prompts: real text, every request's own after the shared prefix (a number
/// first, so no two share a block by accident), each exactly `--prompt-tokens` long (the
/// text repeats; `run` checks that the prompt exceeds the prefix), made as requests are
/// added so a long run holds only those in flight.
struct Prompts {
    text: Vec<u32>,
    shared: Vec<u32>,
    len: usize,
}

impl Prompts {
    fn new(tok: &Tokenizer, a: &BenchServeArgs) -> Result<Self> {
        let text = tok.encode(
            "The quick brown fox jumps over the lazy dog while forty-two kernels run fast. \
             Rivers flow to the sea, and the sea gives back the rain. ",
        )?;
        let shared = text.iter().cycle().take(a.shared_prefix).copied().collect();
        Ok(Prompts {
            text,
            shared,
            len: a.prompt_tokens,
        })
    }

    /// Request i's prompt.
    fn get(&self, tok: &Tokenizer, i: usize) -> Result<Vec<u32>> {
        let mut p = self.shared.clone();
        p.extend(tok.encode(&format!("Request {i}: "))?);
        let from = i * 7 % self.text.len().max(1);
        p.extend(self.text.iter().cycle().skip(from).take(self.len));
        p.truncate(self.len);
        Ok(p)
    }
}

/// Most requests one run takes: each keeps its token times until the report.
const MAX_REQUESTS: usize = 1_000_000;

/// Most rounds a sweep takes (beyond any useful measurement; a larger value is a typo).
const MAX_ROUNDS: usize = 1000;

pub fn run(a: BenchServeArgs) -> Result<()> {
    if a.concurrency.is_empty() || a.concurrency.contains(&0) {
        bail!("--concurrency must list counts of at least 1");
    }
    if a.requests == Some(0) || a.gen_tokens == 0 {
        bail!("--requests, --concurrency and --gen-tokens must be at least 1");
    }
    match (a.requests, a.concurrency.iter().max()) {
        (Some(r), _) if r > MAX_REQUESTS => {
            bail!("--requests {r}: at most {MAX_REQUESTS} in a run")
        }
        (None, Some(&c)) if c > MAX_REQUESTS / 4 => bail!(
            "--concurrency {c} makes 4·{c} requests by default: at most {MAX_REQUESTS} \
             in a run (give --requests)"
        ),
        _ => {}
    }
    if a.rounds == 0 || a.rounds > MAX_ROUNDS {
        bail!("--rounds must be in 1..={MAX_ROUNDS}, not {}", a.rounds);
    }
    if a.prompt_tokens <= a.shared_prefix + 4 {
        bail!(
            "--prompt-tokens {} must exceed --shared-prefix {} by more than 4",
            a.prompt_tokens,
            a.shared_prefix
        );
    }
    let sweep = a.concurrency.len() > 1 || a.rounds > 1;
    if let Some(path) = &a.profile {
        if sweep {
            bail!("--profile records one run: give one --concurrency and --rounds 1");
        }
        crate::profile_cmd::check_writable(path)?;
    }
    for &c in &a.concurrency {
        a.batch.check(seats(&a, c))?;
    }
    let (model, tok) = load(a.model.clone().large_pages_by_default())?;
    check_context(&a, model.cfg.context)?;
    let (model, tok) = (Arc::new(model), Arc::new(tok));
    let mut runs = Vec::with_capacity(a.rounds * a.concurrency.len());
    for round in 0..a.rounds {
        for &c in &a.concurrency {
            let mut j = run_level(&a, (&model, &tok), c)?;
            if sweep {
                j["round"] = serde_json::json!(round + 1);
            }
            runs.push(j);
        }
    }
    if !sweep {
        let j = runs.pop().expect("one run");
        if a.json {
            println!("{j}");
        } else {
            print_report(&j);
        }
        return Ok(());
    }
    sweep_report(&a, runs)
}

/// Every request's prompt and its --gen-tokens fit the model's context: past it the
/// engine ends a generation early (as a server does), and the rates would then count
/// fewer tokens than the run was asked for.
fn check_context(a: &BenchServeArgs, context: usize) -> Result<()> {
    let prompts = [
        ("--prompt-tokens", Some(a.prompt_tokens)),
        ("--long-prompt", a.long_prompt),
    ];
    fits_context(prompts, a.gen_tokens, context)
}

/// [`check_context`] on the flags' values: each prompt given, plus `gen_tokens`, at
/// most `context` positions.
fn fits_context(
    prompts: [(&str, Option<usize>); 2],
    gen_tokens: usize,
    context: usize,
) -> Result<()> {
    for (flag, n) in prompts {
        if let Some(n) = n.filter(|n| n.saturating_add(gen_tokens) > context) {
            bail!(
                "{flag} {n} + --gen-tokens {gen_tokens} exceed the model's {context}-token context"
            );
        }
    }
    Ok(())
}

/// The default --max-seqs of a run at `concurrency`: one more seat for the long prompt,
/// so it runs beside the streams. With exactly `concurrency` seats it waited in the
/// queue until a stream finished, and a 2,048-token prompt "arriving while 8 streams
/// decode" prefilled beside the last few tokens of 7 of them instead.
fn seats(a: &BenchServeArgs, concurrency: usize) -> usize {
    concurrency + usize::from(a.long_prompt.is_some())
}

/// One closed-loop run at `concurrency`: its report as JSON.
fn run_level(
    a: &BenchServeArgs,
    (model, tok): (&Arc<Llama>, &Arc<Tokenizer>),
    concurrency: usize,
) -> Result<serde_json::Value> {
    let requests = a.requests.unwrap_or(4 * concurrency);
    let cfg = a.batch.config(&model.cfg, seats(a, concurrency))?;
    let mut s = Scheduler::new(model.clone(), tok.clone(), cfg)?;
    let prompts = Prompts::new(tok, a)?;
    let req = |prompt: Vec<u32>| GenRequest {
        prompt,
        max_tokens: a.gen_tokens,
        sampling: Sampling::default(),
        ignore_eos: true,
        ..GenRequest::default()
    };
    // Every prompt has the same length, so the first stands for all.
    s.check(&req(prompts.get(tok, 0)?))?;
    let long_req = match a.long_prompt {
        Some(n) => {
            let text = tok.encode("A long document about many things, ")?;
            let r = req(text.iter().cycle().take(n).copied().collect());
            s.check(&r)?;
            Some(r)
        }
        None => None,
    };
    tessera_engine::profile::enable(a.profile.is_some());
    let bar = progress::bar(requests as u64, "bench-serve");
    let t0 = Instant::now();
    let now = || t0.elapsed().as_secs_f64();
    let mut timings: HashMap<SeqId, Timing> = HashMap::new();
    let mut next = 0..requests;
    let (mut finished, mut in_flight) = (0, 0);
    let (mut pre_t, mut pre_n, mut dec_t, mut dec_n) = (0.0, 0u64, 0.0, 0u64);
    let mut long_pending = long_req;
    while finished < requests {
        while in_flight < concurrency {
            let Some(i) = next.next() else { break };
            let id = s.add(req(prompts.get(tok, i)?))?;
            timings.insert(
                id,
                Timing {
                    added: now(),
                    ..Timing::default()
                },
            );
            in_flight += 1;
        }
        let streaming = timings
            .values()
            .filter(|t| !t.long && !t.tokens.is_empty())
            .count();
        if long_pending.is_some() && streaming >= in_flight {
            let id = s.add(long_pending.take().expect("checked"))?;
            timings.insert(
                id,
                Timing {
                    added: now(),
                    long: true,
                    ..Timing::default()
                },
            );
        }
        let before = s.stats();
        let ts = now();
        let events = s.step()?;
        let te = now();
        let after = s.stats();
        let (dp, dd) = (
            after.prompt_tokens_computed - before.prompt_tokens_computed,
            after.decode_tokens - before.decode_tokens,
        );
        match (dp, dd) {
            (0, d) if d > 0 => (dec_t, dec_n) = (dec_t + te - ts, dec_n + d),
            (p, 0) if p > 0 => (pre_t, pre_n) = (pre_t + te - ts, pre_n + p),
            _ => {}
        }
        for e in events {
            match e {
                Event::Token { id, .. } => timings.get_mut(&id).expect("ours").tokens.push(te),
                Event::Finished { id, .. } => {
                    if !timings[&id].long {
                        finished += 1;
                        in_flight -= 1;
                        bar.inc(1);
                    }
                }
                Event::Failed { id, error } => bail!("request {id} failed: {error}"),
            }
        }
    }
    // The long request may still run: finish it for its TTFT.
    while s.has_work() {
        let events = s.step()?;
        let te = now();
        for e in events {
            if let Event::Token { id, .. } = e {
                timings.get_mut(&id).expect("ours").tokens.push(te);
            }
        }
    }
    bar.finish_and_clear();
    let wall = now();
    if let Some(path) = &a.profile {
        tessera_engine::profile::enable(false);
        crate::profile_cmd::report(&tessera_engine::profile::take(), path)?;
    }
    let run = Run {
        requests,
        concurrency,
        wall,
        pure: [(pre_t, pre_n), (dec_t, dec_n)],
    };
    Ok(summary(a, &s, &timings, run))
}

/// What [`summary`] needs of a run besides the scheduler and the timings.
struct Run {
    requests: usize,
    concurrency: usize,
    wall: f64,
    /// Seconds and tokens of the pure prefill steps, then of the pure decode steps.
    pure: [(f64, u64); 2],
}

/// A run's report: rates, latency percentiles, prefix-cache and scheduler counts.
fn summary(
    a: &BenchServeArgs,
    s: &Scheduler,
    timings: &HashMap<SeqId, Timing>,
    run: Run,
) -> serde_json::Value {
    let Run {
        requests,
        concurrency,
        wall,
        pure: [(pre_t, pre_n), (dec_t, dec_n)],
    } = run;
    let streams: Vec<&Timing> = {
        let mut v: Vec<(&SeqId, &Timing)> = timings.iter().filter(|t| !t.1.long).collect();
        v.sort_by_key(|t| t.0);
        v.into_iter().map(|t| t.1).collect()
    };
    let generated: usize = streams.iter().map(|t| t.tokens.len()).sum();
    let ttft: Vec<f64> = streams
        .iter()
        .filter_map(|t| t.tokens.first().map(|f| f - t.added))
        .collect();
    let first_ttft = ttft.first().copied().unwrap_or(f64::NAN);
    let rest_ttft = quantile(&ttft[1.min(ttft.len())..], 0.5);
    let itl: Vec<f64> = streams
        .iter()
        .flat_map(|t| t.tokens.windows(2).map(|w| w[1] - w[0]))
        .collect();
    let long_ttft = timings
        .values()
        .find(|t| t.long)
        .and_then(|t| t.tokens.first().map(|f| f - t.added));
    let st = s.stats();
    let hit_rate = st.blocks.hit_tokens as f64 / st.blocks.lookup_tokens.max(1) as f64;
    let pct = |v: &[f64]| [0.5, 0.9, 0.99].map(|p| quantile(v, p) * 1e3);
    let (t, i) = (pct(&ttft), pct(&itl));
    serde_json::json!({
        "host": host_label(),
        "requests": requests,
        "concurrency": concurrency,
        "prompt_tokens": a.prompt_tokens,
        "gen_tokens": a.gen_tokens,
        "shared_prefix": a.shared_prefix,
        "max_seqs": s.config().max_seqs,
        "max_batch_tokens": s.config().max_batch_tokens,
        "itl_factor": s.config().itl_factor,
        "kv_blocks": s.config().kv_blocks,
        "wall_s": wall,
        "output_tok_s": generated as f64 / wall,
        "total_tok_s": (generated + requests * a.prompt_tokens) as f64 / wall,
        "prefill_only_tok_s": pre_n as f64 / pre_t.max(1e-12),
        "decode_only_tok_s": dec_n as f64 / dec_t.max(1e-12),
        "ttft_ms": {"p50": t[0], "p90": t[1], "p99": t[2], "first": first_ttft * 1e3, "rest_p50": rest_ttft * 1e3},
        "itl_ms": {"p50": i[0], "p90": i[1], "p99": i[2]},
        "long_prompt": a.long_prompt,
        "long_prompt_ttft_ms": long_ttft.map(|v| v * 1e3),
        "prefix_cache_hit_rate": hit_rate,
        "preemptions": st.preemptions,
        "steps": st.steps,
    })
}

/// A number field of a run's report (NaN if absent).
fn num(j: &serde_json::Value, path: &[&str]) -> f64 {
    path.iter()
        .fold(j, |v, k| &v[k])
        .as_f64()
        .unwrap_or(f64::NAN)
}

/// The text report of one run.
fn print_report(j: &serde_json::Value) {
    let n = |path: &[&str]| num(j, path);
    println!("host: {}", j["host"].as_str().unwrap_or("?"));
    println!(
        "{} requests, concurrency {}, {} prompt + {} generated tokens each (shared prefix {})",
        j["requests"], j["concurrency"], j["prompt_tokens"], j["gen_tokens"], j["shared_prefix"]
    );
    println!(
        "throughput: {:.1} output tok/s, {:.1} total tok/s over {:.2} s ({} steps)",
        n(&["output_tok_s"]),
        n(&["total_tok_s"]),
        n(&["wall_s"]),
        j["steps"]
    );
    println!(
        "pure steps: prefill {:.1} tok/s, decode {:.1} tok/s",
        n(&["prefill_only_tok_s"]),
        n(&["decode_only_tok_s"])
    );
    println!(
        "TTFT ms: p50 {:.1}  p90 {:.1}  p99 {:.1}  (first request {:.1}, the rest p50 {:.1})",
        n(&["ttft_ms", "p50"]),
        n(&["ttft_ms", "p90"]),
        n(&["ttft_ms", "p99"]),
        n(&["ttft_ms", "first"]),
        n(&["ttft_ms", "rest_p50"])
    );
    println!(
        "ITL  ms: p50 {:.2}  p90 {:.2}  p99 {:.2}",
        n(&["itl_ms", "p50"]),
        n(&["itl_ms", "p90"]),
        n(&["itl_ms", "p99"])
    );
    if let Some(l) = j["long_prompt_ttft_ms"].as_f64() {
        println!(
            "long prompt of {} tokens: TTFT {l:.1} ms",
            j["long_prompt"].as_u64().unwrap_or(0)
        );
    }
    println!(
        "prefix cache: {:.1}% of looked-up prompt tokens hit; {} preemptions",
        n(&["prefix_cache_hit_rate"]) * 100.0,
        j["preemptions"]
    );
}

/// A sweep's report: per level the decode rates by round, their median, and the ratio
/// to the first level's rate in the same round (and its median); the JSON also carries
/// every run's own report.
fn sweep_report(a: &BenchServeArgs, runs: Vec<serde_json::Value>) -> Result<()> {
    let per_round = a.concurrency.len();
    let decode = |j: &serde_json::Value| num(j, &["decode_only_tok_s"]);
    let levels: Vec<serde_json::Value> = a
        .concurrency
        .iter()
        .enumerate()
        .map(|(l, &c)| {
            let mine: Vec<&serde_json::Value> = runs.iter().skip(l).step_by(per_round).collect();
            let rates: Vec<f64> = mine.iter().map(|j| decode(j)).collect();
            let ratios: Vec<f64> = runs
                .chunks(per_round)
                .map(|round| decode(&round[l]) / decode(&round[0]))
                .collect();
            let med = |path: &[&str]| {
                let v: Vec<f64> = mine.iter().map(|j| num(j, path)).collect();
                quantile(&v, 0.5)
            };
            serde_json::json!({
                "concurrency": c,
                "requests": mine[0]["requests"],
                "decode_only_tok_s": rates,
                "decode_only_tok_s_median": quantile(&rates, 0.5),
                "output_tok_s_median": med(&["output_tok_s"]),
                "itl_p50_ms_median": med(&["itl_ms", "p50"]),
                "itl_p99_ms_median": med(&["itl_ms", "p99"]),
                "decode_ratio_to_first": ratios,
                "decode_ratio_to_first_median": quantile(&ratios, 0.5),
            })
        })
        .collect();
    let host = host_label();
    if a.json {
        let j = serde_json::json!({
            "host": host,
            "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens,
            "shared_prefix": a.shared_prefix,
            "rounds": a.rounds,
            "levels": levels,
            "runs": runs,
        });
        println!("{j}");
        return Ok(());
    }
    println!("host: {host}");
    println!(
        "{} round(s) of concurrency {:?}, {} prompt + {} generated tokens per request; \
         decode = pure decode steps, × = against concurrency {} in the same round",
        a.rounds, a.concurrency, a.prompt_tokens, a.gen_tokens, a.concurrency[0]
    );
    println!(
        "{:>11} {:>8}  {:>12} {:>8}  {:>10} {:>10}  decode tok/s (×) by round",
        "concurrency", "requests", "decode tok/s", "×", "ITL p50 ms", "ITL p99 ms"
    );
    for l in &levels {
        let n = |k: &str| num(l, &[k]);
        let by_round: Vec<String> = l["decode_only_tok_s"]
            .as_array()
            .into_iter()
            .flatten()
            .zip(l["decode_ratio_to_first"].as_array().into_iter().flatten())
            .map(|(r, x)| {
                let (r, x) = (
                    r.as_f64().unwrap_or(f64::NAN),
                    x.as_f64().unwrap_or(f64::NAN),
                );
                format!("{r:.1} ({x:.2}×)")
            })
            .collect();
        println!(
            "{:>11} {:>8}  {:>12.1} {:>7.2}×  {:>10.2} {:>10.2}  {}",
            l["concurrency"].as_u64().unwrap_or(0),
            l["requests"].as_u64().unwrap_or(0),
            n("decode_only_tok_s_median"),
            n("decode_ratio_to_first_median"),
            n("itl_p50_ms_median"),
            n("itl_p99_ms_median"),
            by_round.join(", ")
        );
    }
    Ok(())
}

/// CPU model, best ISA and pool threads: the label every figure carries.
pub fn host_label() -> String {
    let model = tessera_perf::regress::cpu_model();
    format!(
        "{model}, {}, {} threads",
        tessera_core::CpuFeatures::get().summary(),
        tessera_kernels::pool::global().threads()
    )
}

#[cfg(test)]
mod tests {
    use super::fits_context;

    /// A prompt and its generated tokens may fill the context exactly, not one more; an
    /// absent long prompt is no constraint, and absurd values do not overflow.
    #[test]
    fn lengths_fit_the_context_up_to_its_last_position() {
        let long = |n| [("--prompt-tokens", Some(16)), ("--long-prompt", n)];
        assert!(fits_context(long(None), 8176, 8192).is_ok());
        assert!(fits_context(long(Some(8188)), 4, 8192).is_ok());
        let err = fits_context(long(None), 8177, 8192)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--prompt-tokens 16 + --gen-tokens 8177 exceed the model's 8192-token context"
        );
        let err = fits_context(long(Some(8189)), 4, 8192)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--long-prompt 8189 + --gen-tokens 4"),
            "{err}"
        );
        assert!(fits_context(long(None), usize::MAX, 8192).is_err());
    }
}
