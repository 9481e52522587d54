//! Progress bars for long-running commands (bench, tune, regress), on stderr. indicatif
//! hides them when stderr is not a terminal, so logs and CI output stay clean.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps labelled `what`, showing the current item as its message.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template(&format!(
        "{what} [{{bar:30}}] {{pos}}/{{len}} {{elapsed_precise}} eta {{eta}} {{wide_msg}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}
