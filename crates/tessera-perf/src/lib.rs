//! Tessera's performance tooling: calibration of this machine's ceilings, the benchmark
//! runner every registered op goes through, and the reports `tessera verify` / `tessera
//! bench` print.
//!
//! Every rate is compared with ceilings measured in the same process ([`calibrate`]), so
//! a report says "% of what this machine can do right now", not of a datasheet number.

#![warn(missing_docs)]

pub mod bench;
pub mod calibrate;
pub mod peers;
pub mod regress;
pub mod report;
pub mod roofline;
pub mod stats;
pub mod tune;
