//! Float64 attention reference: scores, softmax, weighted sum — one query at a time.

/// Which keys query `i` may see: causal (bottom-right aligned: key j ≤ i + kv_len − q_len)
/// and an optional sliding window of `window` keys ending at that limit.
pub fn key_range(
    i: usize,
    q_len: usize,
    kv_len: usize,
    causal: bool,
    window: Option<usize>,
) -> (usize, usize) {
    let hi = if causal {
        (i + kv_len + 1).saturating_sub(q_len).min(kv_len)
    } else {
        kv_len
    };
    let lo = window.map_or(0, |w| hi.saturating_sub(w));
    (lo, hi)
}

/// One query row against keys/values `(j) -> &[f64]`: softmax(scale·q·kⱼ)·vⱼ over `range`.
pub fn attend(
    q: &[f64],
    range: (usize, usize),
    key: impl Fn(usize) -> Vec<f64>,
    value: impl Fn(usize) -> Vec<f64>,
    scale: f64,
) -> Vec<f64> {
    let d = q.len();
    let scores: Vec<f64> = (range.0..range.1)
        .map(|j| scale * key(j).iter().zip(q).map(|(k, q)| k * q).sum::<f64>())
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut out = vec![0.0; d];
    for (w, j) in weights.iter().zip(range.0..range.1) {
        for (o, v) in out.iter_mut().zip(value(j)) {
            *o += w / total * v;
        }
    }
    if scores.iter().any(|s| s.is_nan()) {
        out.fill(f64::NAN);
    }
    out
}
