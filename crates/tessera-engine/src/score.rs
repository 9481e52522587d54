//! Teacher-forced scoring: the log-probability the model gives each next token of a text,
//! the top-k alternatives at each position, and the text's perplexity.

use crate::kv_cache::KvCache;
use crate::llama::Llama;
use crate::{Error, Result};

/// One position: the token that actually follows and what the model expected there.
#[derive(Clone, Debug, PartialEq)]
pub struct PositionScore {
    pub next: u32,
    /// ln p(next | prefix).
    pub logprob: f64,
    /// The k largest logits, (id, logit), best first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    pub positions: Vec<PositionScore>,
    /// exp(−mean ln p) over the scored positions.
    pub perplexity: f64,
}

/// Scores `tokens[1..]` given their prefixes (one prefill over the whole text).
pub fn score(model: &Llama, tokens: &[u32], top_k: usize) -> Result<Scored> {
    if tokens.len() < 2 {
        return Err(Error::Model("scoring needs at least two tokens".into()));
    }
    if tokens.len() > model.cfg.context {
        return Err(Error::Model(format!(
            "{} tokens exceed the {}-token context",
            tokens.len(),
            model.cfg.context
        )));
    }
    let mut cache = KvCache::new(&model.cfg, tokens.len())?;
    let n = tokens.len() - 1;
    let logits = model.forward_all(&tokens[..n], &mut cache)?;
    let v = model.cfg.vocab;
    let positions: Vec<PositionScore> = (0..n)
        .map(|i| {
            let row = &logits[i * v..(i + 1) * v];
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&l| (l as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            let next = tokens[i + 1];
            let mut top: Vec<(u32, f32)> = row
                .iter()
                .enumerate()
                .map(|(j, &l)| (j as u32, l))
                .collect();
            let k = top_k.min(v);
            if k > 0 {
                top.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
            }
            top.truncate(k);
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            PositionScore {
                next,
                logprob: row[next as usize] as f64 - lse,
                top,
            }
        })
        .collect();
    let mean = positions.iter().map(|p| p.logprob).sum::<f64>() / n as f64;
    Ok(Scored {
        perplexity: (-mean).exp(),
        positions,
    })
}
