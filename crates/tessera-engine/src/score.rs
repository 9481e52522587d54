//! Teacher-forced scoring: the log-probability the model gives each next token of a text,
//! the top-k alternatives at each position, and the text's perplexity.

use crate::kv_cache::KvCache;
use crate::llama::Llama;
use crate::{Error, Result};

/// One position: the token that actually follows and what the model expected there.
#[derive(Clone, Debug, PartialEq)]
pub struct PositionScore {
    /// The token that actually follows.
    pub next: u32,
    /// ln p(next | prefix).
    pub logprob: f64,
    /// The k largest logits, (id, logit), best first.
    pub top: Vec<(u32, f32)>,
    /// ln Σ exp(logits) at this position: a logit minus it is that token's ln p.
    pub log_norm: f64,
}

#[derive(Clone, Debug, PartialEq)]
/// A text's score: every position, and the perplexity.
pub struct Scored {
    /// One entry per scored position.
    pub positions: Vec<PositionScore>,
    /// exp(−mean ln p) over the scored positions.
    pub perplexity: f64,
}

/// Scores `tokens[1..]` given their prefixes: one prefill over the whole text, or, for a
/// model with integer activations (16- or 8-bit), windows of `INT8_BATCH_M` tokens, so
/// that every matmul takes the integer path it takes when generating (a long prefill
/// uses it only where it is the faster prefill: 8-bit, interleaved 4-bit weights).
pub fn score(model: &Llama, tokens: &[u32], alternatives: usize) -> Result<Scored> {
    let mut s = Scorer::new(model, tokens.to_vec(), alternatives)?;
    while !s.advance(model, usize::MAX)? {}
    s.finish()
}

/// A text being scored a slice at a time, so that a server can interleave a long text's
/// scoring with its generation steps (as chunked prefill interleaves a long prompt) and
/// so that only one slice's logits are held at once: a whole 8,192-token text's would
/// be 1.6 GB at the default model's 49,152-token vocabulary.
#[derive(Debug)]
pub struct Scorer {
    tokens: Vec<u32>,
    alternatives: usize,
    /// Allocated by the first [`Scorer::advance`], so a queued scorer holds no cache.
    cache: Option<KvCache>,
    positions: Vec<PositionScore>,
}

impl Scorer {
    /// Checks `tokens` (at least two, within the model's context); computes nothing yet.
    pub fn new(model: &Llama, tokens: Vec<u32>, alternatives: usize) -> Result<Self> {
        if tokens.len() < 2 {
            return Err(Error::request(
                "prompt",
                "scoring needs at least two tokens",
            ));
        }
        if tokens.len() > model.cfg.context {
            return Err(Error::request(
                "prompt",
                format!(
                    "{} tokens exceed the {}-token context",
                    tokens.len(),
                    model.cfg.context
                ),
            ));
        }
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= model.cfg.vocab) {
            return Err(Error::request(
                "prompt",
                format!(
                    "token id {t} is outside the vocabulary of {}",
                    model.cfg.vocab
                ),
            ));
        }
        let positions = Vec::with_capacity(tokens.len() - 1);
        Ok(Scorer {
            tokens,
            alternatives,
            cache: None,
            positions,
        })
    }

    /// Positions scored so far and in all.
    pub fn progress(&self) -> (usize, usize) {
        (self.positions.len(), self.tokens.len() - 1)
    }

    /// Scores up to `max_tokens` more positions (at least one); true once every position
    /// is scored.
    pub fn advance(&mut self, model: &Llama, max_tokens: usize) -> Result<bool> {
        let (done, n) = self.progress();
        if done == n {
            return Ok(true);
        }
        let cache = match &mut self.cache {
            Some(c) => c,
            None => self
                .cache
                .insert(KvCache::new(&model.cfg, self.tokens.len())?),
        };
        let end = n.min(done.saturating_add(max_tokens.max(1)));
        let window = if model.activations() != crate::linear::Activations::F32 {
            tessera_kernels::ops::qmatmul::INT8_BATCH_M
        } else {
            end - done
        };
        let v = model.cfg.vocab;
        for start in (done..end).step_by(window) {
            let w = &self.tokens[start..end.min(start + window)];
            let logits = model.forward_all(w, cache)?;
            for (i, row) in logits.chunks_exact(v).enumerate() {
                let lse = log_sum_exp(row);
                let next = self.tokens[start + i + 1];
                self.positions.push(PositionScore {
                    next,
                    logprob: row[next as usize] as f64 - lse,
                    top: top_k(row, self.alternatives),
                    log_norm: lse,
                });
            }
        }
        if end == n {
            self.cache = None;
        }
        Ok(end == n)
    }

    /// The scores, once [`Scorer::advance`] returned true; an error before.
    pub fn finish(self) -> Result<Scored> {
        let (done, n) = self.progress();
        if done != n {
            return Err(Error::Model(format!(
                "scoring unfinished: {done} of {n} positions"
            )));
        }
        let mean = self.positions.iter().map(|p| p.logprob).sum::<f64>() / n as f64;
        Ok(Scored {
            perplexity: (-mean).exp(),
            positions: self.positions,
        })
    }
}

/// ln Σ exp(row), in f64 (max-shifted).
pub(crate) fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    max + row
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

/// The `k` largest values of `row` with their indices, largest first.
pub(crate) fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(row.len());
    if k == 0 {
        return Vec::new();
    }
    let mut top: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .map(|(j, &l)| (j as u32, l))
        .collect();
    top.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
    top.truncate(k);
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top
}

/// Perplexity as llama.cpp's `llama-perplexity -c ctx` measures it, for side-by-side
/// comparison: consecutive chunks of `ctx` tokens, each from an empty cache, scoring only
/// the predictions made at positions ctx/2 ..= ctx−2 (ctx/2 − 1 per chunk, each with at
/// least ctx/2 tokens of context). Returns the running perplexity after each chunk.
pub fn chunked_perplexity(model: &Llama, tokens: &[u32], ctx: usize) -> Result<Vec<f64>> {
    if ctx < 4 || tokens.len() < ctx {
        return Err(Error::Model(format!(
            "chunked perplexity needs ctx ≥ 4 and at least ctx tokens (ctx {ctx}, {} tokens)",
            tokens.len()
        )));
    }
    let (mut nll, mut scored) = (0.0, 0usize);
    let mut running = Vec::new();
    for chunk in tokens.chunks_exact(ctx) {
        let s = score(model, chunk, 0)?;
        for p in &s.positions[ctx / 2..] {
            nll -= p.logprob;
            scored += 1;
        }
        running.push((nll / scored as f64).exp());
    }
    Ok(running)
}
