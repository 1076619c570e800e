//! Plain text tables, one renderer for the demo's report and the data-dir tools' listings.
//!
//! Written here rather than taken from a table crate: what both need is columns padded to their
//! widest cell, some right-aligned, and an optional rule under the header — a few dozen lines,
//! where the table crates bring borders, styling and terminal detection (and their own
//! dependency trees) that neither output uses.

use std::fmt::Write as _;

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    /// Text: padded on the right.
    Left,
    /// Numbers: padded on the left, so digits line up.
    Right,
}

/// The frame around the cells.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Style {
    /// Spaces before every line.
    pub(crate) indent: usize,
    /// A line of dashes under the header, as wide as each column.
    pub(crate) rule: bool,
}

impl Style {
    /// Listings meant for `grep`, `awk` and `cut` too: no indent, no rule, so the header is the
    /// first line and every other line is a row.
    pub(crate) const LISTING: Style = Style {
        indent: 0,
        rule: false,
    };
    /// A table within a longer report: indented under its heading, header underlined.
    pub(crate) const REPORT: Style = Style {
        indent: 2,
        rule: true,
    };
}

/// Space between two columns.
const GAP: &str = "  ";

/// `rows` under `headers`, each column as wide as its widest cell (counted in characters),
/// aligned by `align` (one per column); every line ends in `\n`, without trailing spaces.
pub(crate) fn render(
    style: Style,
    headers: &[&str],
    align: &[Align],
    rows: &[Vec<String>],
) -> String {
    debug_assert_eq!(headers.len(), align.len(), "one alignment per column");
    let widths: Vec<usize> = (0..headers.len())
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .chain([headers[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = " ".repeat(style.indent);
        for (c, cell) in cells.enumerate() {
            if c > 0 {
                text.push_str(GAP);
            }
            let w = widths[c];
            let _ = match align[c] {
                Align::Left => write!(text, "{cell:<w$}"),
                Align::Right => write!(text, "{cell:>w$}"),
            };
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    if style.rule {
        let dashes: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(&mut dashes.iter().map(String::as_str));
    }
    for row in rows {
        line(&mut row.iter().map(String::as_str).take(headers.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Vec<String>> {
        vec![
            vec!["fast".into(), "200".into(), "records every order".into()],
            vec!["reminders".into(), "1".into(), String::new()],
        ]
    }

    #[test]
    fn listing_starts_with_the_header_and_pads_to_the_widest_cell() {
        let text = render(
            Style::LISTING,
            &["NAME", "N", "WHAT"],
            &[Align::Left; 3],
            &rows(),
        );
        assert_eq!(
            text,
            "NAME       N    WHAT\n\
             fast       200  records every order\n\
             reminders  1\n"
        );
    }

    #[test]
    fn report_is_indented_underlined_and_right_aligns_numbers() {
        let text = render(
            Style::REPORT,
            &["name", "n", "what"],
            &[Align::Left, Align::Right, Align::Left],
            &rows(),
        );
        assert_eq!(
            text,
            "  name         n  what\n  \
             ---------  ---  -------------------\n  \
             fast       200  records every order\n  \
             reminders    1\n"
        );
    }
}
