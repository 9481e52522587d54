//! Hugging Face checkpoints: a directory with `config.json`, `model.safetensors` (or
//! shards listed in `model.safetensors.index.json`) and `tokenizer.json`.
//!
//! Files are memory-mapped and their headers validated by the `safetensors` crate (every
//! tensor's offsets inside the file, no overlaps); tensors are read on request, named the
//! GGUF way by [`WeightSource`] and translated here, so the Llama loader is shared.
//! HF Llama keeps q/k rows in their original order, so these models use half-split RoPE.

use crate::linear::{widen, DenseLinear, Linear};
use crate::llama::Config;
use crate::rope_scaling::RopeScaling;
use crate::weights::WeightSource;
use crate::{Error, Result};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tessera_core::DType;
use tessera_kernels::ops::rope::RopeStyle;

/// One memory-mapped safetensors file and its validated header.
#[derive(Debug)]
struct Shard {
    map: Mmap,
    header_len: usize,
    meta: Metadata,
}

/// An opened HF checkpoint directory.
#[derive(Debug)]
pub struct HfCheckpoint {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// The model configuration read from `config.json`.
    pub config: Config,
    shards: Vec<Shard>,
    /// HF tensor name → shard index.
    index: HashMap<String, usize>,
}

fn err(msg: impl Into<String>) -> Error {
    Error::Model(msg.into())
}

fn read_json(path: &Path) -> Result<Json> {
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| err(format!("{}: {e}", path.display())))
}

/// True when `path` looks like an HF checkpoint directory.
pub fn is_checkpoint(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

impl HfCheckpoint {
    /// Opens `dir`: reads and checks `config.json` and every shard's header (tensors are memory-mapped, not read).
    pub fn open(dir: &Path) -> Result<Self> {
        let json = read_json(&dir.join("config.json"))?;
        let config = config_from_json(&json)?;
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<String> = if index_path.is_file() {
            let idx = read_json(&index_path)?;
            let map = idx["weight_map"]
                .as_object()
                .ok_or_else(|| err("model.safetensors.index.json has no weight_map"))?;
            let mut files: Vec<String> = map
                .values()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| err("weight_map values must be file names"))?;
            files.sort();
            files.dedup();
            files
        } else {
            vec!["model.safetensors".into()]
        };
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for (i, name) in files.iter().enumerate() {
            if name.contains('/') || name.contains("..") {
                return Err(err(format!("shard name '{name}' leaves the directory")));
            }
            let path = dir.join(name);
            let file = std::fs::File::open(&path)
                .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
            // SAFETY: the mapping is read-only and the checkpoint is treated as immutable
            // while loaded (as every mmap-based loader does); a concurrent writer could
            // change values but not break memory safety of the byte slice.
            let map = unsafe { Mmap::map(&file) }
                .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
            let (header_len, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| err(format!("{}: {e}", path.display())))?;
            for t in meta.tensors().keys() {
                if index.insert(t.clone(), i).is_some() {
                    return Err(err(format!("tensor {t} appears in two shards")));
                }
            }
            shards.push(Shard {
                map,
                header_len,
                meta,
            });
        }
        // An untied model without its output matrix would silently reuse the embedding.
        if json["tie_word_embeddings"].as_bool() == Some(false)
            && !index.contains_key("lm_head.weight")
        {
            return Err(err(
                "tie_word_embeddings is false but lm_head.weight is missing",
            ));
        }
        Ok(HfCheckpoint {
            dir: dir.to_path_buf(),
            config,
            shards,
            index,
        })
    }

    /// Values of an HF tensor widened to f32, with its shape.
    fn floats(&self, hf_name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let shard = &self.shards[*self
            .index
            .get(hf_name)
            .ok_or_else(|| err(format!("tensor {hf_name} not in the checkpoint")))?];
        let info = shard
            .meta
            .info(hf_name)
            .ok_or_else(|| err(format!("tensor {hf_name} lost from its shard")))?;
        let (start, end) = info.data_offsets;
        // read_metadata checked that the offsets lie inside the file after the header.
        let bytes = &shard.map[8 + shard.header_len..][start..end];
        let dtype = match info.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            d => return Err(err(format!("{hf_name}: dtype {d:?} is not supported"))),
        };
        let values = widen(dtype, bytes).map_err(|e| err(format!("{hf_name}: {e}")))?;
        Ok((values, info.shape.clone()))
    }
}

/// The HF name of a canonical (GGUF) tensor name.
fn hf_name(name: &str) -> Option<String> {
    let top = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.to_owned());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (part, kind) = rest.rsplit_once('.')?;
    let module = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{module}.{kind}"))
}

impl WeightSource for HfCheckpoint {
    fn has(&self, name: &str) -> bool {
        hf_name(name).is_some_and(|n| self.index.contains_key(&n))
    }
    fn matrix(&self, name: &str) -> Result<Box<dyn Linear>> {
        let hf = hf_name(name).ok_or_else(|| err(format!("no HF name for {name}")))?;
        let (w, shape) = self.floats(&hf)?;
        let [rows, cols] = shape[..] else {
            return Err(err(format!("{hf}: expected a matrix, shape {shape:?}")));
        };
        Ok(Box::new(DenseLinear::new(w, rows, cols)?))
    }
    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let hf = hf_name(name).ok_or_else(|| err(format!("no HF name for {name}")))?;
        let (v, shape) = self.floats(&hf)?;
        if shape.len() != 1 {
            return Err(err(format!("{hf}: expected a vector, shape {shape:?}")));
        }
        Ok(v)
    }
}

/// Hyper-parameters from an HF `config.json` (Llama, Mistral, Qwen2).
pub fn config_from_json(j: &Json) -> Result<Config> {
    let model_type = j["model_type"].as_str().unwrap_or_default();
    if !matches!(model_type, "llama" | "mistral" | "qwen2") {
        return Err(err(format!(
            "config.json model_type '{model_type}' is not supported (llama, mistral, qwen2)"
        )));
    }
    let int = |k: &str| -> Result<usize> {
        j[k].as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v > 0 && v < 1 << 24)
            .ok_or_else(|| err(format!("config.json: {k} = {}", j[k])))
    };
    // Absent: the architecture's default; present, it must be a number (a string here
    // once ran the model with the default θ and silently wrong output).
    let float = |k: &str, default: f64| -> Result<f64> {
        match &j[k] {
            Json::Null => Ok(default),
            v => v
                .as_f64()
                .ok_or_else(|| err(format!("config.json: {k} = {v} is not a number"))),
        }
    };
    let heads = int("num_attention_heads")?;
    let dim = int("hidden_size")?;
    let head_dim = dim / heads.max(1);
    if !j["head_dim"].is_null() && j["head_dim"].as_u64() != Some(head_dim as u64) {
        return Err(err(format!(
            "head_dim {} ≠ hidden_size / heads is not supported",
            j["head_dim"]
        )));
    }
    let mut context = int("max_position_embeddings")?;
    // Mistral's sliding window: attending beyond it would differ from the model, so the
    // context stops there (exact, if shorter than the model allows).
    if let Some(w) = j["sliding_window"]
        .as_u64()
        .filter(|_| model_type == "mistral" || j["use_sliding_window"].as_bool() == Some(true))
    {
        context = context.min(w as usize);
    }
    Config {
        n_layers: int("num_hidden_layers")?,
        dim,
        ffn_dim: int("intermediate_size")?,
        heads,
        kv_heads: if j["num_key_value_heads"].is_null() {
            heads
        } else {
            int("num_key_value_heads")?
        },
        head_dim,
        rope_theta: float("rope_theta", 10_000.0)?,
        eps: float("rms_norm_eps", 1e-6)? as f32,
        vocab: int("vocab_size")?,
        context,
        rope_style: RopeStyle::HalfSplit,
        rope_scaling: RopeScaling::from_hf(&j["rope_scaling"])?,
    }
    .validated()
}
