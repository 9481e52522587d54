//! Continuous batching: many sequences share every forward pass.
//!
//! A [`Scheduler`] holds a waiting queue and a running set. Each [`Scheduler::step`]
//! builds one batch under a token budget (`max_batch_tokens`) and a sequence limit
//! (`max_seqs`): first one token for every decoding sequence (oldest first), then prompt
//! chunks for sequences still prefilling, then new sequences admitted from the queue.
//! Long prompts are thereby split into chunks that share steps with running decodes
//! (chunked prefill), so one long prompt delays each stream by a chunk, not by a
//! prompt. Optionally ([`SchedulerConfig::itl_factor`]) the chunks are also paced while
//! sequences decode (`pacing`): a step takes at most that many times a decode-only
//! step, measured as the scheduler runs. Sequences join and leave between steps; a
//! finished or cancelled sequence frees its blocks at once.
//!
//! KV memory is a fixed pool of blocks (`BlockManager` over a [`KvStore`]). When a
//! decoding sequence needs a block and none is left, the newest running sequence is
//! preempted: its blocks are released (its full ones stay in the prefix cache) and it
//! goes back to the queue with its prompt and generated tokens, to be recomputed later
//! (mostly from the prefix cache) and continue exactly where it stopped. A request whose
//! whole context cannot fit the pool is refused when added, so the oldest sequence can
//! always run and every accepted request completes.
//!
//! Each sequence samples with its own RNG, seeded by its request, so its output does not
//! depend on which other sequences share its steps.

use crate::block_manager::{BlockManager, BlockStats};
use crate::generate::{sample, Sampling, TextStream};
use crate::kv_cache::{KvStore, BLOCK};
use crate::llama::{Llama, LogitRows, SeqInput};
use crate::structured::{Constraint, Grammar, Grammars};
use crate::tokenizer::Detok;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use rand::SeedableRng;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

mod config;
mod pacing;
pub use config::{physical_memory, SchedulerConfig, DEFAULT_KV_FRACTION, MAX_ITL_FACTOR};
use pacing::Pacer;

/// Most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generation request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenRequest {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// At least 1; the model's context also ends a generation.
    pub max_tokens: usize,
    /// How to pick each token (with the request's own seed).
    pub sampling: Sampling,
    /// Generation ends before the first occurrence of any of these.
    pub stop: Vec<String>,
    /// Keep going through end-of-turn tokens (benchmarks that need exact lengths).
    pub ignore_eos: bool,
    /// Report each token's log-probability with this many alternatives (None: no
    /// log-probabilities).
    pub logprobs: Option<usize>,
    /// Constrain the output to this grammar (structured output).
    pub grammar: Option<Grammar>,
}

/// Handle of a request inside a scheduler.
pub type SeqId = u64;

/// A token's log-probability under the model (log-softmax of its logits, before
/// temperature and penalties), with the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// Log-probability of the chosen token.
    pub logprob: f32,
    /// (token, log-probability), most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-turn token.
    StopToken,
    /// One of the request's stop strings.
    StopString,
    /// `max_tokens`, or the model's context.
    Length,
    /// Cancelled by the caller.
    Cancelled,
}

/// Tokens of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub cached_tokens: usize,
}

/// What a step produced for one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A generated token and the text it made showable (possibly empty).
    Token {
        /// The request.
        id: SeqId,
        /// The token id.
        token: u32,
        /// Text this token made showable (possibly empty).
        text: String,
        /// Its log-probability, when the request asked for them.
        logprob: Option<TokenLogprob>,
    },
    /// The request is done; its blocks are already free.
    Finished {
        /// The request.
        id: SeqId,
        /// Why it ended.
        reason: FinishReason,
        /// Showable text held back until the end (it might have begun a stop string):
        /// a stream appends it to the pieces of its `Token` events.
        tail: String,
        /// The whole generated text (cut before a stop string).
        text: String,
        /// Token counts.
        usage: Usage,
    },
    /// The request failed (the model produced NaN); its blocks are free.
    Failed {
        /// The request.
        id: SeqId,
        /// What went wrong.
        error: String,
    },
}

/// Counters for reports and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Requests waiting to start (or preempted, waiting to resume).
    pub waiting: usize,
    /// Requests running.
    pub running: usize,
    /// The KV pool's counters.
    pub blocks: BlockStats,
    /// Steps run.
    pub steps: u64,
    /// Tokens run through the model: prompt (chunks) and decode.
    pub prompt_tokens_computed: u64,
    /// Decode tokens run.
    pub decode_tokens: u64,
    /// Sequences preempted (their blocks freed, recomputed later).
    pub preemptions: u64,
}

#[derive(Debug)]
struct Seq {
    id: SeqId,
    req: GenRequest,
    /// Prompt then generated tokens.
    tokens: Vec<u32>,
    /// Positions whose keys and values are in the cache.
    computed: usize,
    table: Vec<u32>,
    /// Keys of the leading full blocks of `table` (registered in the prefix cache).
    hashes: Vec<u64>,
    rng: rand::rngs::StdRng,
    text: TextStream,
    /// Incremental detokenization of the generated tokens ([`Detok`]).
    detok: Detok,
    /// Prompt positions the prefix cache gave at first admission (None before it).
    cached_tokens: Option<usize>,
    /// Positions the sequence may reach: prompt + max_tokens, at most the context.
    limit: usize,
    constraint: Option<Constraint>,
}

impl Seq {
    fn generated(&self) -> &[u32] {
        &self.tokens[self.req.prompt.len()..]
    }
}

/// The continuous-batching scheduler ([module docs](self)).
#[derive(Debug)]
pub struct Scheduler {
    model: Arc<Llama>,
    tok: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    store: KvStore,
    blocks: BlockManager,
    /// Ordered by id (arrival): preempted sequences go back in their place.
    waiting: VecDeque<Seq>,
    /// Ordered by id.
    running: Vec<Seq>,
    next_id: SeqId,
    stats: SchedulerStats,
    /// Built on the first request with a grammar (the vocabulary trie takes a while).
    grammars: std::sync::OnceLock<Grammars>,
    /// The last step's logits, kept so the next step reuses the allocation.
    logits: Vec<f32>,
    /// Sizes prompt chunks beside decodes (`None`: `cfg.itl_factor` is off).
    pacer: Option<Pacer>,
    /// The last step's (decode rows, prompt tokens, seconds), for
    /// [`Scheduler::prompt_room`].
    last_step: (usize, usize, f64),
}

impl Scheduler {
    /// A scheduler for `model` with a pool of `cfg.kv_blocks` KV blocks (an error for limits that cannot work).
    pub fn new(model: Arc<Llama>, tok: Arc<Tokenizer>, cfg: SchedulerConfig) -> Result<Self> {
        cfg.validate(&model.cfg)?;
        let store = KvStore::new(&model.cfg, cfg.kv_blocks, cfg.kv_dtype)?;
        Ok(Scheduler {
            blocks: BlockManager::new(cfg.kv_blocks, cfg.prefix_caching),
            store,
            model,
            tok,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            stats: SchedulerStats::default(),
            grammars: std::sync::OnceLock::new(),
            logits: Vec::new(),
            pacer: cfg.itl_factor.map(Pacer::new),
            last_step: (0, 0, 0.0),
            cfg,
        })
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The model it runs.
    pub fn model(&self) -> &Arc<Llama> {
        &self.model
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }

    /// Prompt positions the last step left room for: what remains of `max_batch_tokens`
    /// and, when paced, of its time margin beside its decodes (none while their count
    /// has no baseline). A caller that runs other prompt work between steps (the
    /// server's prompt scoring) takes this much and reports its time with
    /// [`Scheduler::record_prompt_work`], so the step and the work together stay within
    /// [`SchedulerConfig::itl_factor`] × a decode-only step.
    pub fn prompt_room(&self) -> usize {
        let (decodes, prompt, secs) = self.last_step;
        let left = self.cfg.max_batch_tokens.saturating_sub(decodes + prompt);
        match &self.pacer {
            Some(p) => left.min(p.room_after(decodes, secs)),
            None => left,
        }
    }

    /// Reports prompt work run after the last step ([`Scheduler::prompt_room`]):
    /// `positions` in `secs`. It prices the next room; without pacing it is ignored.
    pub fn record_prompt_work(&mut self, positions: usize, secs: f64) {
        if let Some(p) = &mut self.pacer {
            p.record_between(positions, secs);
        }
    }

    /// Checks a request as [`Scheduler::add`] would, without queueing it.
    pub fn check(&self, req: &GenRequest) -> Result<()> {
        self.check_fields(req)?;
        if let Some(g) = &req.grammar {
            self.constraint(g)?;
        }
        Ok(())
    }

    /// Every check but the grammar's (which compiles a matcher).
    fn check_fields(&self, req: &GenRequest) -> Result<()> {
        let c = &self.model.cfg;
        req.sampling.validate(c.vocab)?;
        if req.prompt.is_empty() {
            return Err(Error::request("prompt", "empty prompt"));
        }
        if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(Error::request(
                "prompt",
                format!("token id {t} ≥ vocabulary size {}", c.vocab),
            ));
        }
        if req.max_tokens == 0 {
            return Err(Error::request(
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        if req.stop.iter().any(|s| s.is_empty()) {
            return Err(Error::request("stop", "empty stop string"));
        }
        if req.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Err(Error::request(
                "logprobs",
                format!(
                    "top_logprobs {} > {MAX_TOP_LOGPROBS}",
                    req.logprobs.unwrap_or(0)
                ),
            ));
        }
        if req.prompt.len() >= c.context {
            return Err(Error::request(
                "prompt",
                format!(
                    "prompt of {} tokens does not fit the model's {}-token context",
                    req.prompt.len(),
                    c.context
                ),
            ));
        }
        let need = limit(req, c.context).div_ceil(BLOCK);
        if need > self.cfg.kv_blocks {
            return Err(Error::request(
                "max_tokens",
                format!(
                    "a request of {} prompt + {} new tokens needs {need} KV blocks of {BLOCK} \
                     positions; the pool has {} (raise the KV memory or lower max_tokens)",
                    req.prompt.len(),
                    req.max_tokens,
                    self.cfg.kv_blocks
                ),
            ));
        }
        Ok(())
    }

    /// A fresh matcher for `g` (the grammar factory is built on first use).
    fn constraint(&self, g: &Grammar) -> Result<Constraint> {
        if self.grammars.get().is_none() {
            let built = Grammars::new(self.tok.clone(), self.model.cfg.vocab)?;
            let _ = self.grammars.set(built);
        }
        self.grammars.get().expect("set above").matcher(g)
    }

    /// Queues a request; bad requests are errors and queue nothing.
    pub fn add(&mut self, req: GenRequest) -> Result<SeqId> {
        let seq = self.prepare(req)?;
        Ok(self.enqueue(seq))
    }

    /// Queues requests as one group (a request's `n` choices): all of them, or none and
    /// the first error. Each is checked, and its grammar compiled, once.
    pub fn add_group(&mut self, reqs: Vec<GenRequest>) -> Result<Vec<SeqId>> {
        let seqs = reqs
            .into_iter()
            .map(|r| self.prepare(r))
            .collect::<Result<Vec<_>>>()?;
        Ok(seqs.into_iter().map(|s| self.enqueue(s)).collect())
    }

    /// A checked request as a sequence, not yet queued (its id is set by `enqueue`).
    fn prepare(&self, req: GenRequest) -> Result<Seq> {
        self.check_fields(&req)?;
        let constraint = req
            .grammar
            .as_ref()
            .map(|g| self.constraint(g))
            .transpose()?;
        Ok(Seq {
            id: 0,
            tokens: req.prompt.clone(),
            computed: 0,
            table: Vec::new(),
            hashes: Vec::new(),
            rng: rand::rngs::StdRng::seed_from_u64(req.sampling.seed),
            text: TextStream::new(&req.stop),
            detok: Detok::default(),
            cached_tokens: None,
            limit: limit(&req, self.model.cfg.context),
            constraint,
            req,
        })
    }

    fn enqueue(&mut self, mut seq: Seq) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        seq.id = id;
        self.waiting.push_back(seq);
        id
    }

    /// Stops a request: its blocks are freed now. Returns its final event, or None for an
    /// unknown (or already finished) id.
    pub fn cancel(&mut self, id: SeqId) -> Option<Event> {
        let seq = if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i)?
        } else {
            let i = self.running.iter().position(|s| s.id == id)?;
            self.running.remove(i)
        };
        Some(self.finish(seq, FinishReason::Cancelled))
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Current counters.
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            waiting: self.waiting.len(),
            running: self.running.len(),
            blocks: self.blocks.stats(),
            ..self.stats
        }
    }

    /// Runs one batch: schedules, runs the model once, samples. Returns the events of
    /// every request it touched (empty when there is nothing to do).
    pub fn step(&mut self) -> Result<Vec<Event>> {
        let plan = self.schedule();
        self.last_step = (0, 0, 0.0);
        if plan.is_empty() {
            return Ok(Vec::new());
        }
        self.stats.steps += 1;
        let decodes = plan.iter().filter(|&&(i, n)| self.is_decode(i, n)).count();
        let prompt_tokens = plan.iter().map(|p| p.1).sum::<usize>() - decodes;
        let inputs: Vec<SeqInput<'_>> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                SeqInput {
                    tokens: &s.tokens[s.computed..s.computed + n],
                    pos0: s.computed,
                    table: &s.table,
                    logits: match s.computed + n == s.tokens.len() {
                        true => LogitRows::Last,
                        false => LogitRows::None,
                    },
                }
            })
            .collect();
        let started = Instant::now();
        let result = self
            .model
            .forward_batch_into(&mut self.store, &inputs, &mut self.logits);
        let secs = started.elapsed().as_secs_f64();
        self.last_step = (decodes, prompt_tokens, secs);
        if let Some(p) = &mut self.pacer {
            p.record(decodes, prompt_tokens, secs);
        }
        let logits = match result {
            Ok(()) => std::mem::take(&mut self.logits),
            Err(e) => {
                // Nothing the scheduler built should fail; if it does, every request of
                // the step gets the error (none is lost), and the rest go on.
                let ids: Vec<SeqId> = plan.iter().map(|&(i, _)| self.running[i].id).collect();
                let mut events = Vec::new();
                for id in ids {
                    if let Some(i) = self.running.iter().position(|s| s.id == id) {
                        let seq = self.running.remove(i);
                        self.release(&seq);
                        events.push(Event::Failed {
                            id,
                            error: e.to_string(),
                        });
                    }
                }
                return Ok(events);
            }
        };
        let vocab = self.model.cfg.vocab;
        let mut events = Vec::new();
        // (id, why it ended; None: failed, its event already out).
        let mut done: Vec<(SeqId, Option<FinishReason>)> = Vec::new();
        let mut row = 0;
        for &(i, n) in &plan {
            let decode = self.is_decode(i, n);
            let s = &mut self.running[i];
            s.computed += n;
            match decode {
                true => self.stats.decode_tokens += 1,
                false => self.stats.prompt_tokens_computed += n as u64,
            }
            register_full_blocks(&mut self.blocks, s);
            if s.computed < s.tokens.len() {
                continue; // a prompt chunk: no logits
            }
            let l = &logits[row * vocab..(row + 1) * vocab];
            row += 1;
            match next_token(&self.tok, s, l) {
                Ok((ev, end)) => {
                    events.extend(ev);
                    if let Some(reason) = end {
                        done.push((s.id, Some(reason)));
                    }
                }
                Err(e) => {
                    events.push(Event::Failed {
                        id: s.id,
                        error: e.to_string(),
                    });
                    done.push((s.id, None));
                }
            }
        }
        for (id, reason) in done {
            let i = self
                .running
                .iter()
                .position(|s| s.id == id)
                .expect("running");
            let seq = self.running.remove(i);
            match reason {
                Some(reason) => events.push(self.finish(seq, reason)),
                None => self.release(&seq),
            }
        }
        self.logits = logits;
        Ok(events)
    }

    /// Whether `n` tokens of running sequence `i` are a decode (its one newest
    /// generated token), not a prompt chunk.
    fn is_decode(&self, i: usize, n: usize) -> bool {
        let s = &self.running[i];
        n == 1 && s.computed + 1 == s.tokens.len() && !s.generated().is_empty()
    }

    fn release(&mut self, seq: &Seq) {
        self.blocks.release(&seq.table);
    }

    /// Frees a sequence's blocks and makes its final event.
    fn finish(&mut self, mut seq: Seq, reason: FinishReason) -> Event {
        self.release(&seq);
        let tail = match reason {
            FinishReason::StopToken | FinishReason::Length => seq.text.finish(),
            FinishReason::StopString | FinishReason::Cancelled => String::new(),
        };
        Event::Finished {
            id: seq.id,
            reason,
            tail,
            text: seq.text.text().to_string(),
            usage: Usage {
                prompt_tokens: seq.req.prompt.len(),
                completion_tokens: seq.generated().len(),
                cached_tokens: seq.cached_tokens.unwrap_or(0),
            },
        }
    }

    /// The step's batch: (index into `running`, tokens to run), within the limits.
    fn schedule(&mut self) -> Vec<(usize, usize)> {
        loop {
            let plan = self.try_schedule();
            if !plan.is_empty() || self.running.is_empty() {
                return plan;
            }
            // Every running sequence is stuck on blocks held by the others: give the
            // newest one's back (the oldest can always run alone, see `check`).
            self.preempt_newest(None);
        }
    }

    fn try_schedule(&mut self) -> Vec<(usize, usize)> {
        let mut budget = self.cfg.max_batch_tokens;
        let mut plan: Vec<(SeqId, usize)> = Vec::new();
        let mut decodes = 0;
        // 1. One token for each decoding sequence (and each prompt down to its last
        // token by the prefix cache), oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let s = &self.running[i];
            if s.tokens.len() - s.computed != 1 {
                i += 1;
                continue;
            }
            let (id, decode) = (s.id, !s.generated().is_empty());
            if self.grow(i, s.computed + 1) {
                plan.push((id, 1));
                budget -= 1;
                decodes += usize::from(decode);
                i += 1;
                continue;
            }
            // No block left: the newest sequence not yet planned gives its blocks back.
            if !self.preempt_newest(Some(&plan)) {
                break;
            }
            // `i` still points at this sequence unless it was the one preempted.
        }
        // 2. Prompt chunks of running sequences, then 3. new sequences, oldest first,
        // paced beside the decodes against the batch they will all form.
        if let Some(p) = &self.pacer {
            let batch = (self.running.len() + self.waiting.len()).min(self.cfg.max_seqs);
            budget = budget.min(p.allowance(decodes, batch));
        }
        for i in 0..self.running.len() {
            let s = &self.running[i];
            let pending = s.tokens.len() - s.computed;
            if budget == 0 || pending <= 1 || plan.iter().any(|p| p.0 == s.id) {
                continue;
            }
            let chunk = self.fit_chunk(i, pending.min(budget));
            if chunk > 0 {
                plan.push((self.running[i].id, chunk));
                budget -= chunk;
            }
        }
        while budget > 0 && self.running.len() < self.cfg.max_seqs {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            // The prefix cache may cover all but the last token (whose logits we need).
            let (blocks, hashes) = self
                .blocks
                .acquire_prefix(&seq.tokens, seq.tokens.len() - 1);
            seq.computed = blocks.len() * BLOCK;
            seq.table = blocks;
            seq.hashes = hashes;
            // Running stays in arrival order (a preempted sequence goes back in place).
            let i = self.running.partition_point(|r| r.id < seq.id);
            self.running.insert(i, seq);
            let pending = self.running[i].tokens.len() - self.running[i].computed;
            let chunk = self.fit_chunk(i, pending.min(budget));
            if chunk == 0 {
                // Not even one block: back to the head of the queue, blocks returned.
                let mut seq = self.running.remove(i);
                self.blocks.release(&seq.table);
                seq.table.clear();
                seq.hashes.clear();
                seq.computed = 0;
                self.waiting.push_front(seq);
                break;
            }
            let s = &mut self.running[i];
            s.cached_tokens.get_or_insert(s.computed);
            plan.push((s.id, chunk));
            budget -= chunk;
        }
        plan.iter()
            .map(|&(id, n)| {
                let i = self
                    .running
                    .iter()
                    .position(|s| s.id == id)
                    .expect("planned");
                (i, n)
            })
            .collect()
    }

    /// Gives running sequence `i` blocks for `len` positions; false when not available.
    fn grow(&mut self, i: usize, len: usize) -> bool {
        let s = &mut self.running[i];
        let need = len.div_ceil(BLOCK).saturating_sub(s.table.len());
        if need == 0 {
            return true;
        }
        match self.blocks.allocate(need) {
            Some(b) => {
                s.table.extend(b);
                true
            }
            None => false,
        }
    }

    /// The largest chunk ≤ `want` whose blocks running sequence `i` can get (allocated).
    fn fit_chunk(&mut self, i: usize, want: usize) -> usize {
        let s = &self.running[i];
        let have = s.table.len() * BLOCK - s.computed;
        let room = have + self.blocks.available() * BLOCK;
        let chunk = want.min(room);
        let computed = s.computed;
        if chunk > 0 && !self.grow(i, computed + chunk) {
            return 0;
        }
        chunk
    }

    /// Preempts the newest running sequence not in `planned` (any, for None): its
    /// blocks are released and it waits, in arrival order, to be recomputed. False when
    /// there is none to preempt.
    fn preempt_newest(&mut self, planned: Option<&[(SeqId, usize)]>) -> bool {
        let Some(i) = (0..self.running.len())
            .rev()
            .find(|&i| planned.is_none_or(|p| !p.iter().any(|q| q.0 == self.running[i].id)))
        else {
            return false;
        };
        let mut seq = self.running.remove(i);
        self.blocks.release(&seq.table);
        seq.table.clear();
        seq.hashes.clear();
        seq.computed = 0;
        self.stats.preemptions += 1;
        let at = self.waiting.partition_point(|w| w.id < seq.id);
        self.waiting.insert(at, seq);
        true
    }
}

/// Positions a request may reach.
fn limit(req: &GenRequest, context: usize) -> usize {
    req.prompt.len().saturating_add(req.max_tokens).min(context)
}

/// Keys every full block of `s` not keyed yet, so later prompts can share it.
fn register_full_blocks(blocks: &mut BlockManager, s: &mut Seq) {
    while s.hashes.len() < s.computed / BLOCK {
        let b = s.hashes.len();
        let parent = s.hashes.last().copied().unwrap_or(0);
        let h = blocks.register(s.table[b], parent, &s.tokens[b * BLOCK..(b + 1) * BLOCK]);
        s.hashes.push(h);
    }
}

/// Samples the next token of `s` from its logits: the events, and the finish reason if
/// the sequence ends here.
fn next_token(
    tok: &Tokenizer,
    s: &mut Seq,
    logits: &[f32],
) -> Result<(Vec<Event>, Option<FinishReason>)> {
    let next = match &mut s.constraint {
        None => sample(logits, &s.tokens, &s.req.sampling, &mut s.rng)?,
        Some(c) => {
            let mut masked = logits.to_vec();
            c.mask(&mut masked)?;
            let t = sample(&masked, &s.tokens, &s.req.sampling, &mut s.rng)?;
            c.commit(t)?;
            t
        }
    };
    if tok.stop.contains(&next) && (!s.req.ignore_eos || s.constraint.is_some()) {
        return Ok((Vec::new(), Some(FinishReason::StopToken)));
    }
    let logprob = s.req.logprobs.map(|k| logprobs(logits, next, k));
    s.tokens.push(next);
    let generated = &s.tokens[s.req.prompt.len()..];
    let piece = s.text.push(s.detok.advance(tok, generated)?);
    let ev = Event::Token {
        id: s.id,
        token: next,
        text: piece.text,
        logprob,
    };
    let grammar_done = s.constraint.as_ref().is_some_and(Constraint::is_stopped);
    let end = if piece.stopped || grammar_done {
        Some(FinishReason::StopString)
    } else if s.tokens.len() >= s.limit {
        Some(FinishReason::Length)
    } else {
        None
    };
    Ok((vec![ev], end))
}

/// `token`'s log-softmax and the `k` most likely tokens', computed in f64.
fn logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprob {
    let lse = crate::score::log_sum_exp(logits);
    let lp = |l: f32| (l as f64 - lse) as f32;
    TokenLogprob {
        logprob: lp(logits[token as usize]),
        top: crate::score::top_k(logits, k)
            .into_iter()
            .map(|(t, l)| (t, lp(l)))
            .collect(),
    }
}
