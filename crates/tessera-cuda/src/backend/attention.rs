//! The attention launches of [`CudaBackend`]: the tensor-core flash kernel (prefill)
//! and the paged decode kernel with its split plan, apart from the matmul and row-wise
//! launches in the parent module; the checks and buffers they use are the parent's.

use super::*;

impl CudaBackend {
    /// The tensor-core flash kernel over 16-bit buffers of one type.
    pub(super) fn flash(&self, call: &FlashCall<'_>) -> Result<()> {
        let [q, k, v, out] = [call.q, call.k, call.v, call.out].map(|b| b.get::<Half>());
        let (q, k, v, out) = (q?, k?, v?, out?);
        if [k.dtype, v.dtype, out.dtype].iter().any(|&t| t != q.dtype) {
            return Err(Error::Device(format!(
                "cuda flash attention: q {}, k {}, v {}, out {} (one 16-bit type)",
                q.dtype, k.dtype, v.dtype, out.dtype
            )));
        }
        let s = call.shape;
        if s.causal && s.q_len > s.kv_len {
            // The first rows would see no key and come out NaN.
            return Err(Error::shape(
                "cuda flash attention",
                format!(
                    "causal with {} query rows over {} keys (at most as many)",
                    s.q_len, s.kv_len
                ),
            ));
        }
        let shape = AttentionShape {
            batch: 1,
            sq: s.q_len,
            sk: s.kv_len,
            heads: s.heads,
            kv_heads: s.kv_heads,
            d: s.d,
            causal: s.causal,
            scale: s.scale,
        };
        let name = if q.dtype == DType::F16 { "f16" } else { "bf16" };
        let bufs = [&q.bits, &k.bits, &v.bits, &out.bits];
        Ok(crate::ops::flash_launch(&self.gpu, name, bufs, shape)?)
    }

    pub(super) fn paged(&self, call: &PagedCall<'_>) -> Result<()> {
        const OP: &str = "paged_attention";
        let plan = checks::paged(call, MAX_HEAD_DIM)?;
        let c = &call.shape;
        if plan.total_q == 0 || c.heads == 0 {
            return Ok(());
        }
        let mut scratch = self.paged.lock().unwrap_or_else(|e| e.into_inner());
        let scratch = &mut *scratch;
        if scratch.meta.is_none() || scratch.meta_host != plan.meta {
            scratch.meta = None;
            scratch.meta = Some(self.gpu.upload(&plan.meta)?);
            scratch.meta_host.clone_from(&plan.meta);
        }
        let meta = scratch.meta.as_ref().expect("uploaded above");
        let (splits, chunk) = split_plan(&plan.meta[..3 * plan.total_q], c.heads);
        // The cache's storage picks the kernel: f32, or bf16/f16 kept at 16 bits.
        let (kernel, cache) = match (call.k.get::<Half>().ok(), call.v.get::<Half>().ok()) {
            (None, None) => (
                "paged_varlen_f32",
                Cache::F32(f32_view(call.k, 0)?, f32_view(call.v, 0)?),
            ),
            (Some(k), Some(v)) if k.dtype == v.dtype => (
                match k.dtype {
                    DType::BF16 => "paged_varlen_bf16",
                    _ => "paged_varlen_f16",
                },
                Cache::Half(&k.bits, &v.bits),
            ),
            _ => {
                return Err(Error::invalid(
                    OP,
                    "keys and values must share one storage type",
                ))
            }
        };
        let f = self.gpu.function("paged_attention", kernel)?;
        let (q, o) = (f32_view(call.q, 0)?, f32_view(call.out, 0)?);
        // The split workspace: (m, l) and an unnormalised row per split (a 1-element
        // stand-in when one split writes the output directly).
        let parts = if splits > 1 {
            plan.total_q * c.heads * splits
        } else {
            1
        };
        let part_ml = at_least(&self.gpu, &mut scratch.part_ml, 2 * parts)?;
        let part_acc = at_least(&self.gpu, &mut scratch.part_acc, parts * c.d)?;
        let args = [
            int(OP, "query rows", plan.total_q)?,
            int(OP, "heads", c.heads)?,
            int(OP, "kv heads", c.kv_heads)?,
            int(OP, "head width", c.d)?,
            int(OP, "block size", c.block_size)?,
            int(OP, "max blocks", c.max_blocks)?,
            int(OP, "chunk", chunk)?,
        ];
        if c.heads > 65535 {
            return Err(Error::shape(OP, format!("{} heads", c.heads)));
        }
        let mut l = self.gpu.stream().launch_builder(&f);
        l.arg(&q);
        match &cache {
            Cache::F32(k, v) => l.arg(k).arg(v),
            Cache::Half(k, v) => l.arg(*k).arg(*v),
        };
        l.arg(meta).arg(&o).arg(part_ml).arg(part_acc);
        for a in &args {
            l.arg(a);
        }
        l.arg(&c.scale);
        let grid = (plan.total_q as u32, c.heads as u32, splits as u32);
        // SAFETY: matches paged_varlen_{f32,bf16,f16} for the cache's storage (16-bit
        // patterns for the half kernels); the plan checked every block id a row reaches,
        // each visible range, and q/out against total_q × heads × d; the workspace holds
        // every split's (m, l) and row when there are several.
        launched(OP, unsafe { l.launch(cfg(grid, 128)).map(|_| ()) })?;
        if splits == 1 {
            return Ok(());
        }
        let combine = self
            .gpu
            .function("paged_attention", "paged_attention_combine")?;
        let (heads, d, n_splits) = (args[1], args[3], splits as i32);
        let mut l = self.gpu.stream().launch_builder(&combine);
        l.arg(part_ml)
            .arg(part_acc)
            .arg(&o)
            .arg(&heads)
            .arg(&d)
            .arg(&n_splits);
        let block = (c.d.div_ceil(32) * 32) as u32;
        // SAFETY: matches paged_attention_combine over (heads, rows) with the workspace
        // the first launch wrote; split plans keep rows below 65536 (split_plan).
        launched(OP, unsafe {
            l.launch(cfg((c.heads as u32, plan.total_q as u32, 1), block))
                .map(|_| ())
        })
    }
}

/// How many splits each row's visible positions are cut into, and the positions per
/// split: enough blocks (rows × heads × splits) to fill the GPU several times over,
/// splits of at least 64 positions, one split when the rows alone fill it. `rows` is
/// the plan's `(sequence, start, end)` per query row.
fn split_plan(rows: &[u32], heads: usize) -> (usize, usize) {
    const TARGET_BLOCKS: usize = 1024;
    const MIN_CHUNK: usize = 64;
    let longest = rows
        .chunks_exact(3)
        .map(|r| (r[2] - r[1]) as usize)
        .max()
        .unwrap_or(0);
    let base = rows.len() / 3 * heads;
    if base == 0 || base >= TARGET_BLOCKS / 2 || rows.len() / 3 > 65535 {
        return (1, longest.max(1));
    }
    let splits = TARGET_BLOCKS
        .div_ceil(base)
        .min(longest.div_ceil(MIN_CHUNK))
        .max(1);
    (splits, longest.div_ceil(splits).max(1))
}

#[cfg(test)]
mod tests {
    use super::split_plan;

    #[test]
    fn split_plan_fills_the_gpu_only_when_rows_do_not() {
        // One decode row over 2048 positions, 9 heads: 32 splits of 64.
        assert_eq!(split_plan(&[0, 0, 2048], 9), (32, 64));
        // 16 decode rows: 144 blocks, 8 splits (1024 / 144 rounded up) of 256.
        let rows: Vec<u32> = (0..16).flat_map(|s| [s, 0, 2048]).collect();
        assert_eq!(split_plan(&rows, 9), (8, 256));
        // A short context gets at most one split per 64 positions.
        assert_eq!(split_plan(&[0, 0, 100], 9), (2, 50));
        assert_eq!(split_plan(&[0, 10, 40], 9), (1, 30));
        // A prefill chunk of 512 rows fills the GPU on its own.
        let rows: Vec<u32> = (0..512).flat_map(|i| [0, 0, i + 1]).collect();
        assert_eq!(split_plan(&rows, 9), (1, 512));
    }
}
