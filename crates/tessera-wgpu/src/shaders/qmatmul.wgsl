// y[m, n] = x[m, k] · W[n, k]ᵀ with W in a 32-weight ggml block format, repacked at
// upload into per-block (scale, min) pairs and the block's codes as u32 words (4 words
// of nibbles for Q4_0/Q4_1, 8 words of bytes for Q8_0). One workgroup per weight row and
// group of 4 activation rows: each invocation dequantizes whole blocks in registers and
// multiplies them into 4 running sums, which the workgroup then reduces.

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
var<workgroup> red: array<f32, 256>; // [ROWS][WG]

fn weight(j: u32, base: u32) -> f32 {
    if (p.format == 2u) {
        let word = codes[base + j / 4u];
        let byte = (word >> ((j % 4u) * 8u)) & 0xffu;
        return f32(i32(byte << 24u) >> 24u);
    }
    // Nibble formats: weight j < 16 is byte j's low nibble, j ≥ 16 byte (j−16)'s high.
    let byte_i = j % 16u;
    let word = codes[base + byte_i / 4u];
    let byte = (word >> ((byte_i % 4u) * 8u)) & 0xffu;
    var nib = byte & 0xfu;
    if (j >= 16u) {
        nib = byte >> 4u;
    }
    return f32(nib);
}

@compute @workgroup_size(64)
fn qmatmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.x + wg.z * 65535u;
    let m0 = wg.y * ROWS;
    let nb = p.k / 32u;
    var words = 4u;
    if (p.format == 2u) {
        words = 8u;
    }
    var offset = 0.0;
    if (p.format == 0u) {
        offset = 8.0;
    }
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    if (row < p.n) {
        for (var blk = lid.x; blk < nb; blk = blk + WG) {
            let at = row * nb + blk;
            let dm = scales[at];
            let base = at * words;
            var w: array<f32, 32>;
            for (var j = 0u; j < 32u; j = j + 1u) {
                w[j] = (weight(j, base) - offset) * dm.x + dm.y;
            }
            for (var r = 0u; r < ROWS; r = r + 1u) {
                if (m0 + r < p.m) {
                    let xb = p.x_off + (m0 + r) * p.x_sr + blk * 32u;
                    var s = 0.0;
                    for (var j = 0u; j < 32u; j = j + 1u) {
                        s = fma(w[j], x[xb + j], s);
                    }
                    acc[r] = acc[r] + s;
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r = r + 1u) {
        red[r * WG + lid.x] = acc[r];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid.x < s) {
            for (var r = 0u; r < ROWS; r = r + 1u) {
                red[r * WG + lid.x] = red[r * WG + lid.x] + red[r * WG + lid.x + s];
            }
        }
        workgroupBarrier();
    }
    if (lid.x < ROWS && row < p.n && m0 + lid.x < p.m) {
        y[p.y_off + (m0 + lid.x) * p.y_sr + row * p.y_sc] = red[lid.x * WG];
    }
}
