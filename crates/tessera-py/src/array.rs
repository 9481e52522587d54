//! Borrowing caller-owned arrays without copying them.
//!
//! Two producers are read directly: numpy arrays (through rust-numpy's view of the
//! `ndarray` object: data pointer, shape, byte strides, dtype, writeable flag) and anything
//! with `__dlpack__` (PyTorch CPU tensors, JAX, CuPy refuses on CPU devices). Other
//! buffer-protocol objects (`memoryview`, `bytearray`, `array.array`) go through
//! `numpy.asarray`, which wraps the buffer without a copy. Every check a kernel's slice
//! needs is made here, once, with a Python exception: element type, non-negative strides
//! that are whole elements, alignment, a writeable destination, and no overlap between a
//! destination and any other argument (Rust's `&mut` must not alias).

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::c_void;
use tessera_core::{Element, Layout, TensorView, TensorViewMut};

/// Element types the bindings accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
    BF16,
    I32,
    I64,
    U8,
}

impl Elem {
    pub fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::F16 | Elem::BF16 => 2,
            Elem::I64 => 8,
            Elem::U8 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "float32",
            Elem::F16 => "float16",
            Elem::BF16 => "bfloat16",
            Elem::I32 => "int32",
            Elem::I64 => "int64",
            Elem::U8 => "uint8",
        }
    }
}

/// Where an array's elements are: valid while the [`Array`] that made it lives. `Send`
/// (an address, not a pointer), so kernels can run with the GIL released.
#[derive(Clone, Debug)]
pub struct Raw {
    /// Address of element [0, …, 0].
    addr: usize,
    pub elem: Elem,
    pub dims: Vec<usize>,
    /// In elements.
    pub strides: Vec<usize>,
    /// Byte range `[lo, hi)` the elements occupy (for overlap checks).
    lo: usize,
    hi: usize,
}

/// A borrowed array: its raw parts and the Python objects that keep the memory alive
/// (the array, and for DLPack the capsule whose destructor frees the producer's record).
#[derive(Debug)]
pub struct Array<'py> {
    pub raw: Raw,
    pub writeable: bool,
    _keep: Vec<Bound<'py, PyAny>>,
}

fn value_err(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// Borrows `obj` (argument `name`, for messages).
pub fn borrow<'py>(name: &str, obj: &Bound<'py, PyAny>) -> PyResult<Array<'py>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        return from_numpy(name, a);
    }
    if obj.hasattr("__dlpack__")? {
        return from_dlpack(name, obj);
    }
    // The buffer protocol (memoryview, bytearray, array.array): numpy wraps it as is.
    // Lists and scalars become a float64 copy, which the dtype check then refuses.
    let np = obj.py().import("numpy")?;
    let arr =
        np.call_method1("asarray", (obj,)).map_err(|e| {
            PyTypeError::new_err(format!(
            "{name}: expected a numpy array, a tensor with __dlpack__ or a buffer, got {} ({e})",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
        })?;
    let a = arr.cast::<PyUntypedArray>()?.clone();
    from_numpy(name, &a)
}

fn from_numpy<'py>(name: &str, a: &Bound<'py, PyUntypedArray>) -> PyResult<Array<'py>> {
    let dt = a.dtype();
    let elem = match (dt.kind(), dt.itemsize()) {
        (b'f', 4) => Elem::F32,
        (b'f', 2) => Elem::F16,
        (b'i', 4) => Elem::I32,
        (b'i', 8) => Elem::I64,
        (b'u', 1) => Elem::U8,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "{name}: unsupported dtype {} (float32, float16, int32, int64 or uint8)",
                dt.str().map(|s| s.to_string()).unwrap_or_default()
            )))
        }
    };
    if !dt.is_native_byteorder().unwrap_or(true) {
        return Err(PyTypeError::new_err(format!(
            "{name}: byte-swapped arrays are not supported; use .astype(native dtype)"
        )));
    }
    // SAFETY: `as_array_ptr` is the live ndarray object `a` refers to; `data` is its
    // element pointer (read, not dereferenced here).
    let addr = unsafe { (*a.as_array_ptr()).fields.data } as usize;
    let byte_strides: Vec<isize> = a.strides().to_vec();
    let raw = make_raw(name, addr, elem, a.shape().to_vec(), &byte_strides)?;
    let flags = {
        // SAFETY: as above; `flags` is a plain int field of the object.
        unsafe { (*a.as_array_ptr()).fields.flags }
    };
    let writeable = flags & numpy::npyffi::NPY_ARRAY_WRITEABLE != 0;
    Ok(Array {
        raw,
        writeable,
        _keep: vec![a.clone().into_any()],
    })
}

/// DLPack's C structs (dlpack.h, v0.8+ unversioned capsule "dltensor").
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

const DL_CPU: i32 = 1;

fn from_dlpack<'py>(name: &str, obj: &Bound<'py, PyAny>) -> PyResult<Array<'py>> {
    let cap = obj
        .call_method0("__dlpack__")
        .map_err(|e| PyTypeError::new_err(format!("{name}: __dlpack__() failed: {e}")))?;
    let capsule = cap.cast::<PyCapsule>().map_err(|_| {
        PyTypeError::new_err(format!("{name}: __dlpack__() did not return a capsule"))
    })?;
    // We borrow without consuming: the capsule keeps its name, so its destructor calls
    // the producer's deleter when we drop it after the call.
    let ptr = capsule.pointer_checked(Some(c"dltensor"))?;
    // SAFETY: a "dltensor" capsule holds a DLManagedTensor, whose first member is the
    // DLTensor; it stays valid while the capsule lives (kept in `_keep`).
    let t = unsafe { &*(ptr.as_ptr() as *const DlTensor) };
    if t.device.device_type != DL_CPU {
        return Err(value_err(format!(
            "{name}: the tensor is on DLPack device type {} (only CPU memory is supported)",
            t.device.device_type
        )));
    }
    let elem = match (t.dtype.code, t.dtype.bits, t.dtype.lanes) {
        (2, 32, 1) => Elem::F32,
        (2, 16, 1) => Elem::F16,
        (4, 16, 1) => Elem::BF16,
        (0, 32, 1) => Elem::I32,
        (0, 64, 1) => Elem::I64,
        (1, 8, 1) => Elem::U8,
        (c, b, l) => {
            return Err(PyTypeError::new_err(format!(
                "{name}: unsupported DLPack dtype (code {c}, {b} bits, {l} lanes)"
            )))
        }
    };
    let nd = usize::try_from(t.ndim).map_err(|_| value_err(format!("{name}: ndim < 0")))?;
    // SAFETY: shape has ndim entries; strides is NULL (compact row-major) or has ndim.
    let (shape, strides) = unsafe {
        (
            std::slice::from_raw_parts(t.shape, nd),
            (!t.strides.is_null()).then(|| std::slice::from_raw_parts(t.strides, nd)),
        )
    };
    let dims = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| value_err(format!("{name}: negative dim"))))
        .collect::<PyResult<Vec<_>>>()?;
    let es = elem.size() as isize;
    let byte_strides: Vec<isize> = match strides {
        Some(s) => s.iter().map(|&x| x as isize * es).collect(),
        None => {
            let mut v = vec![0isize; nd];
            let mut acc = es;
            for i in (0..nd).rev() {
                v[i] = acc;
                acc *= dims[i].max(1) as isize;
            }
            v
        }
    };
    let addr = (t.data as usize).wrapping_add(t.byte_offset as usize);
    let raw = make_raw(name, addr, elem, dims, &byte_strides)?;
    Ok(Array {
        raw,
        writeable: true,
        _keep: vec![obj.clone(), cap.clone()],
    })
}

/// Checks and converts byte strides; computes the byte range. An empty array has no
/// elements to step to, whatever its strides (numpy gives zeros), so it gets row-major
/// ones.
fn make_raw(
    name: &str,
    addr: usize,
    elem: Elem,
    dims: Vec<usize>,
    byte_strides: &[isize],
) -> PyResult<Raw> {
    let es = elem.size();
    if dims.contains(&0) {
        let mut strides = vec![0; dims.len()];
        let mut acc = 1;
        for (s, &d) in strides.iter_mut().zip(&dims).rev() {
            *s = acc;
            acc *= d.max(1);
        }
        return Ok(Raw {
            addr,
            elem,
            dims,
            strides,
            lo: addr,
            hi: addr,
        });
    }
    let mut strides = Vec::with_capacity(dims.len());
    // Byte offset of the last element; checked, as a DLPack producer's strides are not.
    let mut last = Some(0usize);
    for (&d, &s) in dims.iter().zip(byte_strides) {
        if d == 1 {
            strides.push(0); // never stepped: any stride is as good
            continue;
        }
        if s < 0 || !(s as usize).is_multiple_of(es) {
            return Err(value_err(format!(
                "{name}: stride {s} bytes is negative or not a whole number of {es}-byte \
                 elements; pass a copy (np.ascontiguousarray / .contiguous())"
            )));
        }
        strides.push(s as usize / es);
        last = last.and_then(|l| l.checked_add((d - 1).checked_mul(s as usize)?));
    }
    if !addr.is_multiple_of(es) {
        return Err(value_err(format!(
            "{name}: data is not aligned to its {es}-byte elements"
        )));
    }
    let hi = last
        .and_then(|l| addr.checked_add(l)?.checked_add(es))
        .ok_or_else(|| {
            value_err(format!(
                "{name}: strides {byte_strides:?} overflow the address space"
            ))
        })?;
    Ok(Raw {
        addr,
        elem,
        dims,
        strides,
        lo: addr,
        hi,
    })
}

impl Raw {
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    fn layout(&self) -> PyResult<Layout> {
        Layout::strided(&self.dims, &self.strides, 0).map_err(|e| value_err(e.to_string()))
    }

    /// Elements from element 0 to the last one reached, inclusive.
    fn span(&self) -> usize {
        (self.hi - self.lo) / self.elem.size()
    }

    /// Errors unless the element type is `want`.
    pub fn expect(&self, name: &str, want: Elem) -> PyResult<()> {
        if self.elem != want {
            return Err(PyTypeError::new_err(format!(
                "{name}: expected {}, got {}",
                want.name(),
                self.elem.name()
            )));
        }
        Ok(())
    }

    /// The elements as a slice of `T` (`T`'s size is the element size, checked by the
    /// caller through [`Raw::expect`] or the dispatch on [`Raw::elem`]).
    ///
    /// # Safety
    /// The borrowing [`Array`] is alive, `T` matches `elem`, and no `&mut` view of
    /// overlapping memory exists while the slice is used.
    pub unsafe fn slice<T>(&self) -> &[T] {
        debug_assert_eq!(std::mem::size_of::<T>(), self.elem.size());
        if self.span() == 0 {
            return &[];
        }
        // SAFETY: per the contract, `span` elements from `addr` are the array's memory.
        unsafe { std::slice::from_raw_parts(self.addr as *const T, self.span()) }
    }

    /// As [`Raw::slice`], mutable.
    ///
    /// # Safety
    /// As [`Raw::slice`], the array is writeable, and no other view of overlapping memory
    /// exists while the slice is used ([`check_disjoint`]).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<T>(&self) -> &mut [T] {
        debug_assert_eq!(std::mem::size_of::<T>(), self.elem.size());
        if self.span() == 0 {
            return &mut [];
        }
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut T, self.span()) }
    }

    /// # Safety
    /// As [`Raw::slice`].
    pub unsafe fn view<T: Element>(&self) -> PyResult<TensorView<'_, T>> {
        // SAFETY: forwarded contract.
        let data = unsafe { self.slice::<T>() };
        TensorView::new(data, self.layout()?).map_err(|e| value_err(e.to_string()))
    }

    /// # Safety
    /// As [`Raw::slice_mut`].
    pub unsafe fn view_mut<T: Element>(&self) -> PyResult<TensorViewMut<'_, T>> {
        // SAFETY: forwarded contract.
        let data = unsafe { self.slice_mut::<T>() };
        TensorViewMut::new(data, self.layout()?).map_err(|e| value_err(e.to_string()))
    }

    /// The elements in row-major order, as i64 (int32 or int64 arrays).
    ///
    /// # Safety
    /// The borrowing [`Array`] is alive.
    pub unsafe fn ints(&self, name: &str) -> PyResult<Vec<i64>> {
        let numel: usize = self.dims.iter().product();
        let mut out = Vec::with_capacity(numel);
        if numel == 0 {
            return Ok(out);
        }
        let mut idx = vec![0usize; self.rank()];
        loop {
            let off: usize = idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
            // SAFETY: `off` indexes an element of the live array (idx < dims).
            let v = unsafe {
                match self.elem {
                    Elem::I32 => (self.addr as *const i32).add(off).read() as i64,
                    Elem::I64 => (self.addr as *const i64).add(off).read(),
                    other => {
                        return Err(PyTypeError::new_err(format!(
                            "{name}: expected int32 or int64, got {}",
                            other.name()
                        )))
                    }
                }
            };
            out.push(v);
            let mut i = self.rank();
            loop {
                if i == 0 {
                    return Ok(out);
                }
                i -= 1;
                idx[i] += 1;
                if idx[i] < self.dims[i] {
                    break;
                }
                idx[i] = 0;
            }
        }
    }

    /// [`Raw::ints`] converted to `U` (indices, lengths, positions): a negative or
    /// too-large value is a ValueError naming the argument.
    ///
    /// # Safety
    /// As [`Raw::ints`].
    pub unsafe fn indices<U: TryFrom<i64>>(&self, name: &str) -> PyResult<Vec<U>> {
        // SAFETY: forwarded contract.
        let v = unsafe { self.ints(name) }?;
        v.into_iter()
            .map(|x| {
                U::try_from(x)
                    .map_err(|_| value_err(format!("{name}: {x} is negative or out of range")))
            })
            .collect()
    }

    /// Contiguous row-major?
    pub fn is_contiguous(&self) -> bool {
        let mut want = 1;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            if d > 1 && s != want {
                return false;
            }
            want *= d;
        }
        true
    }

    fn overlaps(&self, other: &Raw) -> bool {
        self.lo < other.hi && other.lo < self.hi
    }
}

impl Array<'_> {
    /// A destination: writeable, float32, of `dims`.
    pub fn expect_out(&self, name: &str, dims: &[usize]) -> PyResult<()> {
        if !self.writeable {
            return Err(value_err(format!("{name}: the array is read-only")));
        }
        self.raw.expect(name, Elem::F32)?;
        if self.raw.dims != dims {
            return Err(value_err(format!(
                "{name}: shape {:?}, expected {dims:?}",
                self.raw.dims
            )));
        }
        Ok(())
    }
}

/// Errors if a destination overlaps any other argument.
pub fn check_disjoint(out_name: &str, out: &Raw, others: &[(&str, &Raw)]) -> PyResult<()> {
    for (name, r) in others {
        if out.overlaps(r) {
            return Err(value_err(format!(
                "{out_name} overlaps {name}: the kernels do not run in place; pass a separate array"
            )));
        }
    }
    Ok(())
}

/// The destination: `out` if given (writeable float32 of `dims`, disjoint from every
/// input), else a new float32 numpy array of `dims`.
pub fn output<'py>(
    py: Python<'py>,
    out: Option<&Bound<'py, PyAny>>,
    dims: &[usize],
    inputs: &[(&str, &Raw)],
) -> PyResult<(Bound<'py, PyAny>, Array<'py>)> {
    let obj = match out {
        Some(o) => o.clone(),
        None => numpy::PyArray::<f32, _>::zeros(py, dims.to_vec(), false).into_any(),
    };
    let a = borrow("out", &obj)?;
    a.expect_out("out", dims)?;
    check_disjoint("out", &a.raw, inputs)?;
    Ok((obj, a))
}
