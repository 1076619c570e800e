//! Progress of long work on stderr: a redrawn bar on a terminal, plain lines otherwise.
//!
//! Hand-rolled (about 60 lines) instead of `indicatif`: one bar, no spinner, no styles, no
//! multi-bar; a dependency would not earn its place.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Width of the bar in characters.
const WIDTH: u64 = 30;
/// Least time between two redraws on a terminal.
const REDRAW: Duration = Duration::from_millis(100);

/// One piece of long work with a known total.
#[derive(Debug)]
pub(crate) struct Progress {
    label: String,
    terminal: bool,
    last_draw: Option<Instant>,
    /// Next tenth of the total at which a plain line is printed.
    next_tenth: u64,
    drawn: bool,
}

impl Progress {
    /// Progress of `label` on stderr, a bar when stderr is a terminal.
    pub(crate) fn new(label: impl Into<String>) -> Self {
        Self::with_terminal(label, std::io::stderr().is_terminal())
    }

    fn with_terminal(label: impl Into<String>, terminal: bool) -> Self {
        Self {
            label: label.into(),
            terminal,
            last_draw: None,
            next_tenth: 1,
            drawn: false,
        }
    }

    /// `done` of `total` finished.
    pub(crate) fn update(&mut self, done: u64, total: u64) {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(self.render(done, total).as_bytes());
        let _ = err.flush();
    }

    /// What [`Progress::update`] writes (empty when nothing is due).
    fn render(&mut self, done: u64, total: u64) -> String {
        let total = total.max(1);
        let done = done.min(total);
        if self.terminal {
            let now = Instant::now();
            if done < total && self.last_draw.is_some_and(|t| now - t < REDRAW) {
                return String::new();
            }
            self.last_draw = Some(now);
            self.drawn = true;
            let filled = done * WIDTH / total;
            let bar: String = (0..WIDTH)
                .map(|i| if i < filled { '#' } else { '.' })
                .collect();
            format!(
                "\r{} [{bar}] {done}/{total} ({}%)",
                self.label,
                done * 100 / total
            )
        } else {
            // Plain lines at each tenth reached, and at the end.
            let tenth = done * 10 / total;
            if tenth < self.next_tenth && done < total {
                return String::new();
            }
            self.next_tenth = tenth + 1;
            format!("{}: {done}/{total}\n", self.label)
        }
    }

    /// End the bar's line (a no-op for plain output).
    pub(crate) fn finish(&mut self) {
        if self.terminal && self.drawn {
            eprintln!();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_at_each_tenth_and_the_end() {
        let mut p = Progress::with_terminal("redrive", false);
        let lines: String = (1..=25).map(|d| p.render(d, 25)).collect();
        assert_eq!(lines.lines().count(), 10, "{lines}");
        assert!(lines.ends_with("redrive: 25/25\n"), "{lines}");
        assert!(!lines.contains('\r'));
    }

    #[test]
    fn terminal_bar_redraws_in_place() {
        let mut p = Progress::with_terminal("redrive", true);
        let first = p.render(1, 4);
        assert!(first.starts_with("\rredrive ["), "{first}");
        assert!(first.ends_with("1/4 (25%)"), "{first}");
        // The final state is always drawn, however soon after the last draw.
        assert!(p.render(4, 4).ends_with("4/4 (100%)"));
    }
}
