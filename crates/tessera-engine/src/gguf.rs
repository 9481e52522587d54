//! GGUF v2/v3 reader: memory-mapped, every field validated before use.
//!
//! A model file is untrusted input. Every count, length and offset read from it is checked
//! against the bytes actually left before anything is allocated or sliced, so a truncated
//! or corrupt file gives an [`Error::Gguf`] naming the problem, never a panic, a huge
//! allocation or a read out of bounds. Tensor data stays in the mapping and is handed out
//! as byte slices (block formats are viewed in place by `tessera_kernels::quant`).

use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use tessera_core::DType;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 12.
    F64(f64),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8 (UTF-8).
    String(String),
    /// GGUF type 9: values of one type.
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// A float or integer as f64; None for other types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<usize>,
    /// Storage type.
    pub dtype: DType,
    /// Byte offset from the start of the data section.
    pub offset: usize,
    /// Bytes in the file.
    pub size: usize,
}

impl TensorInfo {
    /// (rows, cols) of a 1-D or 2-D tensor: rows = product of the outer dims.
    pub fn rows_cols(&self) -> (usize, usize) {
        (self.dims[1..].iter().product(), self.dims[0])
    }
}

/// An open GGUF file.
#[derive(Debug)]
pub struct Gguf {
    map: memmap2::Mmap,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Every metadata key and its value.
    pub metadata: BTreeMap<String, Value>,
    /// Tensor headers, in file order.
    pub tensors: Vec<TensorInfo>,
    data_start: usize,
}

/// ggml type ids this reader maps to Tessera dtypes.
fn dtype_of(id: u32) -> Option<DType> {
    Some(match id {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        3 => DType::Q4_1,
        6 => DType::Q5_0,
        7 => DType::Q5_1,
        8 => DType::Q8_0,
        10 => DType::Q2_K,
        11 => DType::Q3_K,
        12 => DType::Q4_K,
        13 => DType::Q5_K,
        14 => DType::Q6_K,
        15 => DType::Q8_K,
        30 => DType::BF16,
        _ => return None,
    })
}

/// Arrays nest at most this deep (the format allows arrays of arrays; real files use 1).
const MAX_DEPTH: usize = 4;

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                gguf(format!(
                    "truncated: {what} needs {n} bytes at offset {}, file has {}",
                    self.pos,
                    self.b.len()
                ))
            })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn left(&self) -> usize {
        self.b.len() - self.pos
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
    /// A count that must fit in what is left, at `min_each` bytes per item.
    fn count(&mut self, what: &str, min_each: usize) -> Result<usize> {
        let n = self.u64(what)?;
        if n > (self.left() / min_each.max(1)) as u64 {
            return Err(gguf(format!(
                "{what} = {n} is more than the {} bytes left can hold",
                self.left()
            )));
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| gguf(format!("{what} is not UTF-8")))
    }
    fn value(&mut self, ty: u32, depth: usize, key: &str) -> Result<Value> {
        macro_rules! num {
            ($t:ty, $v:ident) => {
                Value::$v(<$t>::from_le_bytes(
                    self.take(std::mem::size_of::<$t>(), key)?
                        .try_into()
                        .expect("sized"),
                ))
            };
        }
        Ok(match ty {
            0 => num!(u8, U8),
            1 => num!(i8, I8),
            2 => num!(u16, U16),
            3 => num!(i16, I16),
            4 => num!(u32, U32),
            5 => num!(i32, I32),
            6 => num!(f32, F32),
            7 => match self.take(1, key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(gguf(format!("{key}: bool byte {b}"))),
            },
            8 => Value::String(self.string(key)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(gguf(format!(
                        "{key}: arrays nested deeper than {MAX_DEPTH}"
                    )));
                }
                let et = self.u32(key)?;
                let n = self.count(
                    key,
                    min_size(et)
                        .ok_or_else(|| gguf(format!("{key}: unknown array element type {et}")))?,
                )?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(et, depth + 1, key)?);
                }
                Value::Array(v)
            }
            10 => num!(u64, U64),
            11 => num!(i64, I64),
            12 => num!(f64, F64),
            _ => return Err(gguf(format!("{key}: unknown value type {ty}"))),
        })
    }
}

/// The fewest bytes a value of this type occupies (to bound array counts).
fn min_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 9 => 8, // a length prefix at least
        10..=12 => 8,
        _ => return None,
    })
}

fn gguf(msg: String) -> Error {
    Error::Gguf(msg)
}

impl Gguf {
    /// Maps and validates a file.
    pub fn open(path: &Path) -> Result<Self> {
        let file =
            std::fs::File::open(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        // SAFETY: the mapping is read-only and private to this process; a file changed
        // underneath it while mapped could show torn data but cannot violate memory safety
        // of the slices we hand out (every access is bounds-checked against the length).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        Self::parse(map)
    }

    fn parse(map: memmap2::Mmap) -> Result<Self> {
        let mut c = Cursor {
            b: &map[..],
            pos: 0,
        };
        if c.take(4, "magic")? != b"GGUF" {
            return Err(gguf("not a GGUF file (bad magic)".into()));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(gguf(format!("version {version} (supported: 2, 3)")));
        }
        let n_tensors = c.count("tensor count", 24)?;
        let n_kv = c.count("metadata count", 12)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.u32(&key)?;
            let v = c.value(ty, 0, &key)?;
            if metadata.insert(key.clone(), v).is_some() {
                return Err(gguf(format!("duplicate metadata key {key}")));
            }
        }
        let mut tensors = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            tensors.push(tensor_info(&mut c)?);
        }
        let align = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => v
                .as_u64()
                .filter(|a| a.is_power_of_two() && *a <= 1 << 16)
                .ok_or_else(|| gguf(format!("general.alignment {v:?}")))?
                as usize,
        };
        let data_start = c.pos.div_ceil(align) * align;
        let data_len = map
            .len()
            .checked_sub(data_start)
            .ok_or_else(|| gguf("truncated before the tensor data".into()))?;
        check_layout(&tensors, align, data_len)?;
        Ok(Gguf {
            version,
            metadata,
            tensors,
            data_start,
            map,
        })
    }

    /// The tensor with this name.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| gguf(format!("missing tensor {name}")))
    }

    /// The bytes of a tensor (validated at open).
    pub fn bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.map[self.data_start + t.offset..][..t.size]
    }

    /// Tells the kernel a tensor's pages are no longer needed, once the loader has
    /// copied them: without it the mapped file stays resident next to the copy and
    /// peak memory is twice the model. Whole pages inside the tensor only; a hint,
    /// so failure changes nothing but memory use.
    #[cfg(unix)]
    pub fn release(&self, t: &TensorInfo) {
        const PAGE: usize = 4096;
        let start = (self.data_start + t.offset).next_multiple_of(PAGE);
        let end = (self.data_start + t.offset + t.size) / PAGE * PAGE;
        if end > start {
            // SAFETY: the map is a read-only file mapping, so dropping its pages loses
            // nothing: a later read faults them back in from the file. No slice into
            // the range is used across this call by the engine (the data was copied).
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    end - start,
                )
            };
        }
    }

    #[cfg(not(unix))]
    pub fn release(&self, _t: &TensorInfo) {}

    /// A metadata value, or an error naming the missing key.
    pub fn get(&self, key: &str) -> Result<&Value> {
        self.metadata
            .get(key)
            .ok_or_else(|| gguf(format!("missing metadata {key}")))
    }
}

fn tensor_info(c: &mut Cursor<'_>) -> Result<TensorInfo> {
    let name = c.string("tensor name")?;
    let nd = c.u32(&name)? as usize;
    if !(1..=4).contains(&nd) {
        return Err(gguf(format!("tensor {name}: {nd} dims")));
    }
    let mut dims = Vec::with_capacity(nd);
    for _ in 0..nd {
        let d = c.u64(&name)?;
        dims.push(usize::try_from(d).map_err(|_| gguf(format!("tensor {name}: dim {d}")))?);
    }
    let ty = c.u32(&name)?;
    let dtype = dtype_of(ty).ok_or_else(|| {
        gguf(format!(
            "tensor {name}: ggml type {ty} is not supported yet"
        ))
    })?;
    let offset =
        usize::try_from(c.u64(&name)?).map_err(|_| gguf(format!("tensor {name}: offset")))?;
    let numel = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let size = numel
        .filter(|_| dims[0] % dtype.block_size() == 0)
        .and_then(|n| dtype.storage_bytes(n))
        .ok_or_else(|| gguf(format!("tensor {name}: dims {dims:?} invalid for {dtype}")))?;
    Ok(TensorInfo {
        name,
        dims,
        dtype,
        offset,
        size,
    })
}

/// Every tensor aligned, inside the data section, and no two overlapping.
fn check_layout(tensors: &[TensorInfo], align: usize, data_len: usize) -> Result<()> {
    let mut spans: Vec<(usize, usize, &str)> = Vec::with_capacity(tensors.len());
    for t in tensors {
        if t.offset % align != 0 {
            return Err(gguf(format!(
                "tensor {}: offset {} not {align}-aligned",
                t.name, t.offset
            )));
        }
        let end = t.offset.checked_add(t.size).filter(|&e| e <= data_len).ok_or_else(|| {
            gguf(format!("tensor {}: bytes {}..+{} beyond the {data_len}-byte data section (truncated file?)", t.name, t.offset, t.size))
        })?;
        spans.push((t.offset, end, &t.name));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(gguf(format!("tensors {} and {} overlap", w[0].2, w[1].2)));
        }
    }
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(gguf(format!("duplicate tensor {}", w[0])));
    }
    Ok(())
}
