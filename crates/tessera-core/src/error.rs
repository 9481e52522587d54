//! The one error type of the core and kernel layers.

/// Everything a caller can get wrong, named so the message says what to fix.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum Error {
    /// Shapes that do not agree (e.g. GEMM inner dimensions).
    #[error("{op}: shape mismatch: {detail}")]
    Shape {
        /// The op that checked.
        op: &'static str,
        /// Which shapes, and what was expected.
        detail: String,
    },
    /// A tensor of the wrong rank.
    #[error("{op}: expected rank {expected}, got rank {got}")]
    Rank {
        /// The op that checked.
        op: &'static str,
        /// The rank(s) it takes.
        expected: String,
        /// The rank it got.
        got: usize,
    },
    /// A view whose strides reach past the end of its buffer.
    #[error("view out of bounds: layout needs {needed} elements, buffer has {len}")]
    OutOfBounds {
        /// Elements the layout reaches.
        needed: usize,
        /// Elements the buffer has.
        len: usize,
    },
    /// A mutable view in which two indices name the same element.
    #[error("mutable view overlaps itself (dims {dims:?}, strides {strides:?})")]
    Overlapping {
        /// The view's dims.
        dims: Vec<usize>,
        /// The view's strides.
        strides: Vec<usize>,
    },
    /// A dtype the op does not accept.
    #[error("{op}: unsupported dtype {dtype}")]
    DType {
        /// The op that checked.
        op: &'static str,
        /// The dtype it was given.
        dtype: String,
    },
    /// A size whose element count or byte count overflows, or is absurd.
    #[error("size overflow: {0}")]
    Overflow(String),
    /// Any other argument out of its documented range.
    #[error("{op}: invalid argument: {detail}")]
    Invalid {
        /// The op that checked.
        op: &'static str,
        /// Which argument, and its range.
        detail: String,
    },
    /// The requested ISA or backend is not available on this machine.
    #[error("unsupported on this machine: {0}")]
    Unsupported(String),
    /// An accelerator refused or failed an operation (no adapter, out of memory, a
    /// buffer from another backend).
    #[error("device: {0}")]
    Device(String),
}

/// Result alias for the core and kernel crates.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::Shape`].
    pub fn shape(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Shape {
            op,
            detail: detail.into(),
        }
    }

    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Invalid {
            op,
            detail: detail.into(),
        }
    }
}
