// y[m, n] = x[m, k] · W[n, k]ᵀ with W in a 32-weight ggml block format, repacked at
// upload into per-block (scale, min) pairs and the block's codes as u32 words (4 words
// of nibbles for Q4_0/Q4_1, 8 words of bytes for Q8_0). One invocation per weight row
// and group of 4 activation rows: it walks the row's blocks, expands each code word into
// four weights in registers and multiplies them into 4 running sums. No workgroup
// memory and no barriers: with one row per workgroup and a shared reduction, a decode
// matvec ran at 16 MB/s on lavapipe, whose barriers are costly and whose rows (576
// weights: 18 blocks) left most of a 64-wide workgroup idle.
struct Params {
    m: u32,
    n: u32,
    k: u32,
    format: u32, // 0: Q4_0, 1: Q4_1, 2: Q8_0
    x_off: u32,
    x_sr: u32,
    y_off: u32,
    y_sr: u32,
    y_sc: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> scales: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read> codes: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
const ROWS: u32 = 4u;

// Four activations from element i.
fn x4(i: u32) -> vec4<f32> {
    return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}

@compute @workgroup_size(64)
fn qmatmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = (wg.x + wg.z * 65535u) * WG + lid.x;
    let m0 = wg.y * ROWS;
    if (row >= p.n) {
        return;
    }
    let nb = p.k / 32u;
    let rows = min(ROWS, p.m - m0);
    var offset = 0.0;
    if (p.format == 0u) {
        offset = 8.0;
    }
    var acc = vec4<f32>(0.0);
    for (var blk = 0u; blk < nb; blk = blk + 1u) {
        let at = row * nb + blk;
        let dm = scales[at];
        let xb = p.x_off + m0 * p.x_sr + blk * 32u;
        if (p.format == 2u) {
            // Q8_0: word i holds weights 4i..4i+3 as signed bytes.
            for (var i = 0u; i < 8u; i = i + 1u) {
                let word = codes[at * 8u + i];
                let q = vec4<i32>(
                    i32(word << 24u) >> 24u,
                    i32(word << 16u) >> 24u,
                    i32(word << 8u) >> 24u,
                    i32(word) >> 24u,
                );
                let w = vec4<f32>(q) * dm.x + dm.y;
                for (var r = 0u; r < rows; r = r + 1u) {
                    acc[r] = acc[r] + dot(w, x4(xb + r * p.x_sr + 4u * i));
                }
            }
        } else {
            // Nibbles: byte b's low half is weight b, its high half weight b + 16.
            for (var i = 0u; i < 4u; i = i + 1u) {
                let word = codes[at * 4u + i];
                let lo = vec4<u32>(word, word >> 8u, word >> 16u, word >> 24u) & vec4<u32>(0xfu);
                let hi = vec4<u32>(word >> 4u, word >> 12u, word >> 20u, word >> 28u) & vec4<u32>(0xfu);
                let wl = (vec4<f32>(lo) - offset) * dm.x + dm.y;
                let wh = (vec4<f32>(hi) - offset) * dm.x + dm.y;
                for (var r = 0u; r < rows; r = r + 1u) {
                    let xr = xb + r * p.x_sr + 4u * i;
                    acc[r] = acc[r] + dot(wl, x4(xr)) + dot(wh, x4(xr + 16u));
                }
            }
        }
    }
    for (var r = 0u; r < rows; r = r + 1u) {
        y[p.y_off + (m0 + r) * p.y_sr + row * p.y_sc] = acc[r];
    }
}
