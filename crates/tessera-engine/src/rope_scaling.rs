//! RoPE scaling, the ways Llama-family checkpoints stretch their trained context:
//!
//! - **linear** (position interpolation): every frequency divided by `factor`;
//! - **llama3** (Llama 3.1/3.2): long wavelengths divided by `factor`, short ones kept,
//!   a smooth blend between `low_freq_factor` and `high_freq_factor`;
//! - **per-pair factors** from a GGUF `rope_freqs.weight` tensor: llama.cpp's converter
//!   bakes llama3 scaling into it, frequency i divided by factor i.
//!
//! The result is one frequency per rotated pair, handed to the RoPE kernel. Unknown
//! scaling types (YaRN, dynamic NTK, …) are errors rather than silently unscaled.

use crate::{Error, Result};
use serde_json::Value as Json;
use tessera_kernels::ops::rope::base_frequencies;

/// How a model scales its RoPE frequencies.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RopeScaling {
    #[default]
    /// Frequencies as trained.
    None,
    /// Every frequency divided by `factor` (position interpolation).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's scheme: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths beyond `original_context / low_freq_factor` count as low.
        low_freq_factor: f64,
        /// Wavelengths below `original_context / high_freq_factor` count as high.
        high_freq_factor: f64,
        /// The context the model was pretrained with.
        original_context: f64,
    },
    /// Frequency i divided by `factors[i]` (GGUF `rope_freqs.weight`).
    Factors(Vec<f64>),
}

fn bad(msg: String) -> Error {
    Error::Model(msg)
}

impl RopeScaling {
    /// From an HF config.json `rope_scaling` object (null: none).
    pub fn from_hf(j: &Json) -> Result<Self> {
        if j.is_null() {
            return Ok(RopeScaling::None);
        }
        let kind = j["rope_type"].as_str().or(j["type"].as_str()).unwrap_or("");
        let num = |k: &str| {
            j[k].as_f64()
                .ok_or_else(|| bad(format!("rope_scaling.{k} missing in {j}")))
        };
        let s = match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: num("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_context: num("original_max_position_embeddings")?,
            },
            other => {
                return Err(bad(format!(
                    "rope_scaling type '{other}' is not supported (linear, llama3)"
                )))
            }
        };
        s.validated()
    }

    /// From GGUF metadata (`{arch}.rope.scaling.type` / `.factor`); per-pair factors from
    /// a `rope_freqs.weight` tensor are added by the loader.
    pub fn from_gguf(kind: Option<&str>, factor: Option<f64>) -> Result<Self> {
        let s = match kind {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: factor.ok_or_else(|| bad("linear RoPE scaling without a factor".into()))?,
            },
            Some(other) => {
                return Err(bad(format!(
                    "rope scaling type '{other}' is not supported (none, linear)"
                )))
            }
        };
        s.validated()
    }

    /// Per-pair divisors (a GGUF `rope_freqs.weight`), checked finite and positive.
    pub fn factors(f: Vec<f64>) -> Result<Self> {
        RopeScaling::Factors(f).validated()
    }

    fn validated(self) -> Result<Self> {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        let fine = match &self {
            RopeScaling::None => true,
            RopeScaling::Linear { factor } => ok(*factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                ok(*factor)
                    && ok(*low_freq_factor)
                    && ok(*original_context)
                    && high_freq_factor.is_finite()
                    && high_freq_factor > low_freq_factor
            }
            RopeScaling::Factors(f) => f.iter().all(|&v| ok(v)),
        };
        match fine {
            true => Ok(self),
            false => Err(bad(format!("invalid RoPE scaling {self:?}"))),
        }
    }

    /// The scaled frequency of each of the `d/2` pairs.
    pub fn frequencies(&self, d: usize, theta: f64) -> Result<Vec<f64>> {
        let base = base_frequencies(d, theta);
        Ok(match self {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                let low_wavelen = original_context / low_freq_factor;
                let high_wavelen = original_context / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (original_context / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Factors(fs) => {
                if fs.len() != base.len() {
                    return Err(bad(format!(
                        "rope_freqs has {} factors for head dim {d}",
                        fs.len()
                    )));
                }
                base.iter().zip(fs).map(|(f, s)| f / s).collect()
            }
        })
    }
}
