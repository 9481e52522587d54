//! Prometheus metrics (the `prometheus-client` crate does the text format): requests by
//! endpoint and status, the scheduler's queue and running set, KV blocks, the prefix
//! cache's hit rate, tokens (counters, and a recent tokens/s gauge), prompt scorings
//! (`echo` with log-probabilities: queued, and positions scored), and histograms of
//! time to first token and inter-token latency. The engine thread updates everything but
//! the request counters after every step.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Instant;
use tessera_engine::scheduler::SchedulerStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    status: u16,
}

/// Every metric the server exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    waiting: Gauge,
    running: Gauge,
    blocks_used: Gauge,
    blocks_free: Gauge,
    blocks_cached: Gauge,
    hit_rate: Gauge<f64, AtomicU64>,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    preemptions: Counter,
    tokens_per_s: Gauge<f64, AtomicU64>,
    scorings: Gauge,
    scored_positions: Counter,
    /// Time to first token, seconds.
    pub ttft: Histogram,
    /// Time between tokens of a stream, seconds.
    pub itl: Histogram,
    /// (time, generated tokens) at the start of the current tokens/s window.
    window: Mutex<(Instant, u64)>,
}

/// The tokens/s gauge is the rate over windows of at least this long.
const RATE_WINDOW_S: f64 = 2.0;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tessera");
        let m = Metrics {
            requests: Family::default(),
            waiting: Gauge::default(),
            running: Gauge::default(),
            blocks_used: Gauge::default(),
            blocks_free: Gauge::default(),
            blocks_cached: Gauge::default(),
            hit_rate: Gauge::default(),
            prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            preemptions: Counter::default(),
            tokens_per_s: Gauge::default(),
            scorings: Gauge::default(),
            scored_positions: Counter::default(),
            // 1 ms .. ~33 s and 0.25 ms .. ~8 s.
            ttft: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            itl: Histogram::new(exponential_buckets(0.00025, 2.0, 16)),
            window: Mutex::new((Instant::now(), 0)),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "requests",
            "HTTP requests by endpoint and status",
            m.requests.clone(),
        );
        r.register(
            "queue_length",
            "Requests waiting for a slot",
            m.waiting.clone(),
        );
        r.register(
            "running_sequences",
            "Sequences in the running set",
            m.running.clone(),
        );
        r.register(
            "kv_blocks_used",
            "KV blocks held by sequences",
            m.blocks_used.clone(),
        );
        r.register(
            "kv_blocks_free",
            "KV blocks an allocation can take (free or cached)",
            m.blocks_free.clone(),
        );
        r.register(
            "kv_blocks_cached",
            "Unreferenced KV blocks keeping a cached prefix",
            m.blocks_cached.clone(),
        );
        r.register(
            "prefix_cache_hit_rate",
            "Share of looked-up prompt tokens found in the prefix cache",
            m.hit_rate.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens computed (cache hits excluded)",
            m.prompt_tokens.clone(),
        );
        r.register(
            "generation_tokens",
            "Tokens generated",
            m.generated_tokens.clone(),
        );
        r.register(
            "preemptions",
            "Sequences preempted for KV blocks",
            m.preemptions.clone(),
        );
        r.register(
            "generation_tokens_per_second",
            "Generated tokens per second over the last few seconds",
            m.tokens_per_s.clone(),
        );
        r.register(
            "prompt_scorings",
            "Prompt scorings (echo with logprobs) queued or running",
            m.scorings.clone(),
        );
        r.register(
            "scored_positions",
            "Prompt positions scored for echo with logprobs",
            m.scored_positions.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "From a sequence's submission to its first token",
            m.ttft.clone(),
        );
        r.register(
            "inter_token_latency_seconds",
            "Between consecutive tokens of a sequence",
            m.itl.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Counts one finished HTTP request.
    pub fn request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.into(),
                status,
            })
            .inc();
    }

    /// Counts one generated token.
    pub fn token(&self) {
        self.generated_tokens.inc();
    }

    /// Records the prompt scorings queued or running and `positions` more scored.
    pub fn record_scoring(&self, queued: usize, positions: usize) {
        self.scorings.set(queued as i64);
        self.scored_positions.inc_by(positions as u64);
    }

    /// Updates the engine's gauges and counters from the stats before and after a step.
    pub fn record_step(&self, before: &SchedulerStats, after: &SchedulerStats) {
        let b = &after.blocks;
        self.waiting.set(after.waiting as i64);
        self.running.set(after.running as i64);
        self.blocks_used.set(b.used as i64);
        self.blocks_free.set((b.total - b.used) as i64);
        self.blocks_cached.set(b.cached as i64);
        self.hit_rate
            .set(b.hit_tokens as f64 / b.lookup_tokens.max(1) as f64);
        let d = |a: u64, b: u64| a.saturating_sub(b);
        self.prompt_tokens.inc_by(d(
            after.prompt_tokens_computed,
            before.prompt_tokens_computed,
        ));
        self.preemptions
            .inc_by(d(after.preemptions, before.preemptions));
        let Ok(mut w) = self.window.lock() else {
            return;
        };
        let elapsed = w.0.elapsed().as_secs_f64();
        if elapsed >= RATE_WINDOW_S {
            let total = self.generated_tokens.get();
            self.tokens_per_s.set(d(total, w.1) as f64 / elapsed);
            *w = (Instant::now(), total);
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
