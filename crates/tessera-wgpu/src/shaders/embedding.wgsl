// Embedding gather: one invocation per output element, out[i, c] = table[ids[i], c]
// through the table's offset and strides.

struct Params {
    len: u32,
    dim: u32,
    offset: u32,
    row_stride: u32,
    col_stride: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> table: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn embedding(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * 65535u * 256u;
    if (i >= p.len) {
        return;
    }
    let row = i / p.dim;
    let c = i % p.dim;
    out[i] = table[p.offset + ids[row] * p.row_stride + c * p.col_stride];
}
