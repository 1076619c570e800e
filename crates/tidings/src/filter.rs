//! Declarative, serialisable filters over message headers (R-RT-3, R-LIM-1).
//!
//! [`HeaderFilter`] documents the filters and their serialised form; they are re-exported at
//! the crate root.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use serde::{Deserialize, Serialize};

/// Maximum nesting depth of a filter accepted by [`HeaderFilter::validate`]. A leaf alone has
/// depth 1; each [`AllOf`](HeaderFilter::AllOf), [`AnyOf`](HeaderFilter::AnyOf) or
/// [`Not`](HeaderFilter::Not) adds one level.
pub const MAX_FILTER_DEPTH: usize = 32;

/// Maximum number of terms in a filter accepted by [`HeaderFilter::validate`]: every filter node
/// counts one and every value of a [`OneOf`](HeaderFilter::OneOf) counts one more. Bounds the
/// work done per offered message.
pub const MAX_FILTER_TERMS: usize = 1024;

/// Read access to a message's headers by name.
///
/// Names are compared exactly (case-sensitive) by the implementations in this module. When a
/// name occurs more than once, implementations over lists return the first occurrence.
pub trait HeaderLookup {
    /// The value of header `name`, if present.
    fn header(&self, name: &str) -> Option<&str>;
}

impl<T: HeaderLookup + ?Sized> HeaderLookup for &T {
    fn header(&self, name: &str) -> Option<&str> {
        (**self).header(name)
    }
}

impl HeaderLookup for [(&str, &str)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }
}

impl<const N: usize> HeaderLookup for [(&str, &str); N] {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

impl HeaderLookup for Vec<(&str, &str)> {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

impl HeaderLookup for [(String, String)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl HeaderLookup for Vec<(String, String)> {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

impl<S: BuildHasher> HeaderLookup for HashMap<String, String, S> {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

impl HeaderLookup for BTreeMap<String, String> {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

/// A declarative predicate over message headers (R-RT-3).
///
/// Leaves test one header by `name`; when that header is absent every leaf is false (so
/// `Not(Exists)` is how to ask for absence). Call [`validate`](Self::validate) before accepting
/// a filter from outside.
///
/// A filter is plain data: it can be built in code, stored, sent over the wire as JSON
/// (or any serde format) and evaluated server-side by a remote backend. It is evaluated against
/// anything implementing [`HeaderLookup`].
///
/// ```
/// # use tidings::HeaderFilter;
/// let f = HeaderFilter::eq("region", "eu")
///     .and(HeaderFilter::range("priority", Some(5.0), None))
///     .and(HeaderFilter::exists("trace-id").not());
/// let headers = [("region", "eu"), ("priority", "7")];
/// assert!(f.matches(&headers));
/// f.validate().unwrap();
/// ```
///
/// # Serialised form
///
/// Externally tagged, snake_case variant names, for example
/// `{"all_of":[{"equals":{"name":"region","value":"eu"}},{"not":{"exists":{"name":"x"}}}]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HeaderFilter {
    /// Header `name` is present and equal to `value` (exact, byte-wise).
    Equals {
        /// Header name.
        name: String,
        /// Required value.
        value: String,
    },
    /// Header `name` is present and equal to one of `values`. An empty list matches nothing.
    OneOf {
        /// Header name.
        name: String,
        /// Accepted values.
        values: Vec<String>,
    },
    /// Header `name` is present (with any value, including empty).
    Exists {
        /// Header name.
        name: String,
    },
    /// Header `name` is present and its value starts with `prefix` (byte-wise; an empty prefix
    /// matches any present header).
    Prefix {
        /// Header name.
        name: String,
        /// Required prefix.
        prefix: String,
    },
    /// Header `name` is present, its value parses as an `f64`, is not NaN, and lies within
    /// `min ..= max` (**both bounds inclusive**; a `None` bound is unbounded).
    ///
    /// Parsing is Rust's `str::parse::<f64>()`: decimal or exponent notation, optional sign, `inf` /
    /// `infinity` accepted, no surrounding whitespace. A value that does not parse, or parses to
    /// NaN, never matches.
    Range {
        /// Header name.
        name: String,
        /// Inclusive lower bound.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
        /// Inclusive upper bound.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<f64>,
    },
    /// Every sub-filter matches. An empty list matches everything.
    AllOf(Vec<HeaderFilter>),
    /// At least one sub-filter matches. An empty list matches nothing.
    AnyOf(Vec<HeaderFilter>),
    /// The sub-filter does not match.
    Not(Box<HeaderFilter>),
}

/// Why [`HeaderFilter::validate`] refused a filter (R-LIM-1).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    /// A leaf has an empty header name.
    #[error("header filter has an empty header name")]
    EmptyName,
    /// A range's `min` is greater than its `max`, so it can never match.
    #[error("range on header {name:?} has min {min} greater than max {max}")]
    MinGreaterThanMax {
        /// Header name.
        name: String,
        /// The lower bound.
        min: f64,
        /// The upper bound.
        max: f64,
    },
    /// A range bound is NaN.
    #[error("range on header {name:?} has a NaN bound")]
    NanBound {
        /// Header name.
        name: String,
    },
    /// Nesting deeper than [`MAX_FILTER_DEPTH`].
    #[error("header filter nests deeper than the limit of {max} levels")]
    TooDeep {
        /// The limit ([`MAX_FILTER_DEPTH`]).
        max: usize,
    },
    /// More than [`MAX_FILTER_TERMS`] terms.
    #[error("header filter has more than the limit of {max} terms")]
    TooManyTerms {
        /// The limit ([`MAX_FILTER_TERMS`]).
        max: usize,
    },
}

impl HeaderFilter {
    /// `Equals`: header `name` equals `value`.
    #[allow(clippy::should_implement_trait)] // a constructor, not `PartialEq::eq`
    #[must_use]
    pub fn eq(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self::Equals {
            name: name.into(),
            value: value.into(),
        }
    }

    /// `OneOf`: header `name` equals one of `values`.
    #[must_use]
    pub fn one_of<I, S>(name: impl Into<String>, values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::OneOf {
            name: name.into(),
            values: values.into_iter().map(Into::into).collect(),
        }
    }

    /// `Exists`: header `name` is present.
    #[must_use]
    pub fn exists(name: impl Into<String>) -> Self {
        Self::Exists { name: name.into() }
    }

    /// `Prefix`: header `name` starts with `prefix`.
    #[must_use]
    pub fn prefix(name: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self::Prefix {
            name: name.into(),
            prefix: prefix.into(),
        }
    }

    /// `Range`: header `name` is numeric and within `min ..= max` (inclusive).
    #[must_use]
    pub fn range(name: impl Into<String>, min: Option<f64>, max: Option<f64>) -> Self {
        Self::Range {
            name: name.into(),
            min,
            max,
        }
    }

    /// `AllOf` of the given filters.
    #[must_use]
    pub fn all_of(filters: impl IntoIterator<Item = HeaderFilter>) -> Self {
        Self::AllOf(filters.into_iter().collect())
    }

    /// `AnyOf` of the given filters.
    #[must_use]
    pub fn any_of(filters: impl IntoIterator<Item = HeaderFilter>) -> Self {
        Self::AnyOf(filters.into_iter().collect())
    }

    /// Both `self` and `other` must match. Flattens into an existing `AllOf` on either side, so
    /// chains of `.and` stay one level deep.
    #[must_use]
    pub fn and(self, other: HeaderFilter) -> Self {
        let mut list = match self {
            Self::AllOf(v) => v,
            f => vec![f],
        };
        match other {
            Self::AllOf(v) => list.extend(v),
            f => list.push(f),
        }
        Self::AllOf(list)
    }

    /// Either `self` or `other` must match. Flattens into an existing `AnyOf` on either side.
    #[must_use]
    pub fn or(self, other: HeaderFilter) -> Self {
        let mut list = match self {
            Self::AnyOf(v) => v,
            f => vec![f],
        };
        match other {
            Self::AnyOf(v) => list.extend(v),
            f => list.push(f),
        }
        Self::AnyOf(list)
    }

    /// The negation of `self` (`Not(self)`; a double negation is kept as written).
    #[allow(clippy::should_implement_trait)] // also available as `!filter`
    #[must_use]
    pub fn not(self) -> Self {
        Self::Not(Box::new(self))
    }

    /// Evaluates the filter against `headers`.
    ///
    /// Never panics. Evaluation recurses once per nesting level, so filters from outside should
    /// pass [`validate`](Self::validate) (which bounds depth and size) first.
    #[must_use]
    pub fn matches<H: HeaderLookup + ?Sized>(&self, headers: &H) -> bool {
        match self {
            Self::Equals { name, value } => headers.header(name) == Some(value.as_str()),
            Self::OneOf { name, values } => headers
                .header(name)
                .is_some_and(|h| values.iter().any(|v| v == h)),
            Self::Exists { name } => headers.header(name).is_some(),
            Self::Prefix { name, prefix } => headers
                .header(name)
                .is_some_and(|h| h.starts_with(prefix.as_str())),
            Self::Range { name, min, max } => {
                let Some(x) = headers.header(name).and_then(|h| h.parse::<f64>().ok()) else {
                    return false;
                };
                !x.is_nan() && min.is_none_or(|m| x >= m) && max.is_none_or(|m| x <= m)
            }
            Self::AllOf(fs) => fs.iter().all(|f| f.matches(headers)),
            Self::AnyOf(fs) => fs.iter().any(|f| f.matches(headers)),
            Self::Not(f) => !f.matches(headers),
        }
    }

    /// Checks the filter makes sense and is within limits (R-LIM-1): no empty header name, no
    /// NaN range bound, no `min > max`, depth at most [`MAX_FILTER_DEPTH`], at most
    /// [`MAX_FILTER_TERMS`] terms. Stops at the first problem found (depth first, left to right).
    ///
    /// Empty `AllOf` / `AnyOf` / `OneOf` lists and a `Range` with no bounds ("is numeric") are
    /// accepted: they have a well-defined meaning. Infinite bounds are accepted.
    ///
    /// # Errors
    ///
    /// The first problem found, as a [`FilterError`].
    pub fn validate(&self) -> Result<(), FilterError> {
        let mut terms = 0;
        self.validate_at(1, &mut terms)
    }

    fn validate_at(&self, depth: usize, terms: &mut usize) -> Result<(), FilterError> {
        if depth > MAX_FILTER_DEPTH {
            return Err(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH,
            });
        }
        *terms += 1;
        if let Self::OneOf { values, .. } = self {
            *terms = terms.saturating_add(values.len());
        }
        if *terms > MAX_FILTER_TERMS {
            return Err(FilterError::TooManyTerms {
                max: MAX_FILTER_TERMS,
            });
        }
        match self {
            Self::Equals { name, .. }
            | Self::OneOf { name, .. }
            | Self::Exists { name }
            | Self::Prefix { name, .. } => check_header_name(name),
            Self::Range { name, min, max } => {
                check_header_name(name)?;
                if min.is_some_and(f64::is_nan) || max.is_some_and(f64::is_nan) {
                    return Err(FilterError::NanBound { name: name.clone() });
                }
                if let (Some(lo), Some(hi)) = (*min, *max)
                    && lo > hi
                {
                    return Err(FilterError::MinGreaterThanMax {
                        name: name.clone(),
                        min: lo,
                        max: hi,
                    });
                }
                Ok(())
            }
            Self::AllOf(fs) | Self::AnyOf(fs) => {
                fs.iter().try_for_each(|f| f.validate_at(depth + 1, terms))
            }
            Self::Not(f) => f.validate_at(depth + 1, terms),
        }
    }
}

fn check_header_name(name: &str) -> Result<(), FilterError> {
    if name.is_empty() {
        Err(FilterError::EmptyName)
    } else {
        Ok(())
    }
}

/// `!filter` is [`HeaderFilter::not`].
impl std::ops::Not for HeaderFilter {
    type Output = HeaderFilter;

    fn not(self) -> HeaderFilter {
        HeaderFilter::Not(Box::new(self))
    }
}

/// `a & b` is [`HeaderFilter::and`].
impl std::ops::BitAnd for HeaderFilter {
    type Output = HeaderFilter;

    fn bitand(self, rhs: HeaderFilter) -> HeaderFilter {
        self.and(rhs)
    }
}

/// `a | b` is [`HeaderFilter::or`].
impl std::ops::BitOr for HeaderFilter {
    type Output = HeaderFilter;

    fn bitor(self, rhs: HeaderFilter) -> HeaderFilter {
        self.or(rhs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HeaderFilter as F;

    const H: [(&str, &str); 6] = [
        ("region", "eu-west"),
        ("tier", "gold"),
        ("prio", "7"),
        ("temp", "-2.5e1"),
        ("empty", ""),
        ("text", "abc"),
    ];

    #[test]
    fn leaves() {
        let cases: Vec<(F, bool)> = vec![
            (F::eq("tier", "gold"), true),
            (F::eq("tier", "Gold"), false),
            (F::eq("Tier", "gold"), false),
            (F::eq("missing", "gold"), false),
            (F::eq("empty", ""), true),
            (F::one_of("tier", ["silver", "gold"]), true),
            (F::one_of("tier", ["silver"]), false),
            (F::one_of("tier", Vec::<String>::new()), false),
            (F::one_of("missing", ["gold"]), false),
            (F::exists("empty"), true),
            (F::exists("missing"), false),
            (F::prefix("region", "eu-"), true),
            (F::prefix("region", ""), true),
            (F::prefix("region", "us-"), false),
            (F::prefix("region", "eu-west-1"), false),
            (F::prefix("missing", ""), false),
            (F::range("prio", Some(7.0), Some(7.0)), true), // inclusive both ends
            (F::range("prio", Some(5.0), None), true),
            (F::range("prio", None, Some(6.99)), false),
            (F::range("prio", Some(7.01), None), false),
            (F::range("prio", None, None), true),
            (F::range("temp", Some(-30.0), Some(-20.0)), true),
            (F::range("text", None, None), false),
            (F::range("empty", None, None), false),
            (F::range("missing", None, None), false),
        ];
        for (f, want) in cases {
            assert_eq!(f.matches(&H), want, "{f:?}"); // R-RT-3
        }
    }

    #[test]
    fn range_parsing_edges() {
        let inf = [("x", "inf")];
        assert!(F::range("x", Some(0.0), None).matches(&inf)); // R-RT-3
        assert!(!F::range("x", None, Some(1e300)).matches(&inf)); // R-RT-3
        let nan = [("x", "NaN")];
        assert!(!F::range("x", None, None).matches(&nan)); // R-RT-3: NaN never matches
        let spaced = [("x", " 5")];
        assert!(!F::range("x", None, None).matches(&spaced)); // R-RT-3: no trimming
        let neg_zero = [("x", "-0")];
        assert!(F::range("x", Some(0.0), Some(0.0)).matches(&neg_zero)); // R-RT-3
    }

    #[test]
    fn combinators_and_nesting() {
        let gold_eu = F::eq("tier", "gold").and(F::prefix("region", "eu"));
        assert!(gold_eu.matches(&H)); // R-RT-3
        assert!(matches!(&gold_eu, F::AllOf(v) if v.len() == 2));
        let three = gold_eu.clone().and(F::exists("prio"));
        assert!(matches!(&three, F::AllOf(v) if v.len() == 3)); // flattened
        assert!(three.matches(&H)); // R-RT-3
        assert!(!three.clone().and(F::exists("nope")).matches(&H)); // R-RT-3
        let either = F::eq("tier", "silver").or(F::eq("region", "eu-west"));
        assert!(either.matches(&H)); // R-RT-3
        assert!(!F::eq("tier", "silver").or(F::exists("nope")).matches(&H)); // R-RT-3
        assert!(F::exists("nope").not().matches(&H)); // R-RT-3
        assert!(!F::exists("tier").not().matches(&H)); // R-RT-3
        assert!(F::exists("tier").not().not().matches(&H)); // R-RT-3
        assert!(F::all_of([]).matches(&H)); // R-RT-3: empty AllOf is true
        assert!(!F::any_of([]).matches(&H)); // R-RT-3: empty AnyOf is false
        // Operators.
        assert_eq!(!F::exists("a"), F::exists("a").not());
        assert_eq!(
            F::exists("a") & F::exists("b"),
            F::exists("a").and(F::exists("b"))
        );
        assert_eq!(
            F::exists("a") | F::exists("b"),
            F::exists("a").or(F::exists("b"))
        );
        // Deep nesting: (tier in {gold} and not (prio > 8)) or temp missing.
        let nested = F::any_of([
            F::all_of([
                F::one_of("tier", ["gold"]),
                F::range("prio", Some(8.0), None).not(),
                F::any_of([F::prefix("region", "us"), F::prefix("region", "eu")]),
            ]),
            F::exists("temp").not(),
        ]);
        assert!(nested.matches(&H)); // R-RT-3
        assert!(!nested.matches(&[("tier", "gold"), ("temp", "1")])); // R-RT-3
    }

    #[test]
    fn header_lookup_impls() {
        let f = F::eq("k", "v");
        let slice: &[(&str, &str)] = &[("k", "v"), ("k", "w")];
        assert!(f.matches(slice)); // first occurrence wins
        assert!(f.matches(&vec![("k", "v")]));
        assert!(f.matches(&vec![("k".to_owned(), "v".to_owned())]));
        let map: HashMap<String, String> = [("k".to_owned(), "v".to_owned())].into();
        assert!(f.matches(&map));
        let bmap: BTreeMap<String, String> = [("k".to_owned(), "v".to_owned())].into();
        assert!(f.matches(&bmap));
        let dynamic: &dyn HeaderLookup = &map;
        assert!(f.matches(dynamic));
        assert!(f.matches(&&map));
    }

    #[test]
    fn serde_round_trip() {
        let f = F::any_of([
            F::eq("region", "eu"),
            F::one_of("tier", ["gold", "silver"]),
            F::exists("trace"),
            F::prefix("svc", "pay-"),
            F::range("prio", Some(1.5), None),
            F::range("temp", None, Some(-3.0)),
            F::range("n", None, None),
            F::all_of([F::exists("a"), F::exists("b").not()]),
        ]);
        let json = serde_json::to_string(&f).unwrap();
        let back: F = serde_json::from_str(&json).unwrap();
        assert_eq!(back, f); // R-RT-3: serialisable for remote backends
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["any_of"][0]["equals"]["name"], "region");
        assert_eq!(v["any_of"][4]["range"]["min"], 1.5);
        assert!(v["any_of"][4]["range"].get("max").is_none());
        let hand = r#"{"all_of":[{"equals":{"name":"region","value":"eu"}},
                      {"not":{"exists":{"name":"x"}}},
                      {"range":{"name":"p","max":3}}]}"#;
        let parsed: F = serde_json::from_str(hand).unwrap();
        assert_eq!(
            parsed,
            F::eq("region", "eu")
                .and(F::exists("x").not())
                .and(F::range("p", None, Some(3.0)))
        ); // R-RT-3
        assert!(serde_json::from_str::<F>(r#"{"regex":{"name":"a"}}"#).is_err());
    }

    fn nest(depth: usize) -> F {
        // `depth` levels in total: depth-1 `Not`s around a leaf.
        let mut f = F::exists("x");
        for _ in 1..depth {
            f = f.not();
        }
        f
    }

    #[test]
    fn validate_errors() {
        assert_eq!(F::eq("", "v").validate(), Err(FilterError::EmptyName)); // R-LIM-1
        assert_eq!(F::exists("").validate(), Err(FilterError::EmptyName)); // R-LIM-1
        assert_eq!(
            F::exists("a").and(F::prefix("", "p")).validate(),
            Err(FilterError::EmptyName)
        ); // R-LIM-1
        assert_eq!(
            F::range("p", Some(2.0), Some(1.0)).validate(),
            Err(FilterError::MinGreaterThanMax {
                name: "p".into(),
                min: 2.0,
                max: 1.0
            })
        ); // R-LIM-1
        assert_eq!(
            F::range("p", Some(f64::NAN), None).validate(),
            Err(FilterError::NanBound { name: "p".into() })
        ); // R-LIM-1
        assert_eq!(
            F::range("p", None, Some(f64::NAN)).validate(),
            Err(FilterError::NanBound { name: "p".into() })
        ); // R-LIM-1
        // Accepted edge cases.
        assert_eq!(F::range("p", Some(1.0), Some(1.0)).validate(), Ok(()));
        assert_eq!(F::range("p", None, None).validate(), Ok(()));
        assert_eq!(
            F::range("p", Some(f64::NEG_INFINITY), Some(f64::INFINITY)).validate(),
            Ok(())
        );
        assert_eq!(F::all_of([]).validate(), Ok(()));
        assert_eq!(F::one_of("a", Vec::<String>::new()).validate(), Ok(()));
        // Depth: exactly the limit passes, one more fails.
        assert_eq!(nest(MAX_FILTER_DEPTH).validate(), Ok(())); // R-LIM-1
        assert_eq!(
            nest(MAX_FILTER_DEPTH + 1).validate(),
            Err(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH
            })
        ); // R-LIM-1
        assert!(
            FilterError::TooDeep {
                max: MAX_FILTER_DEPTH
            }
            .to_string()
            .contains("32")
        ); // R-LIM-1: message names the limit
        // A very deep filter is refused without recursing all the way down.
        let deep = nest(10_000);
        assert!(matches!(deep.validate(), Err(FilterError::TooDeep { .. }))); // R-LIM-1
        // Terms: AllOf + (limit - 1) leaves = exactly the limit.
        let at = F::all_of((0..MAX_FILTER_TERMS - 1).map(|_| F::exists("a")));
        assert_eq!(at.validate(), Ok(())); // R-LIM-1
        let over = F::all_of((0..MAX_FILTER_TERMS).map(|_| F::exists("a")));
        assert_eq!(
            over.validate(),
            Err(FilterError::TooManyTerms {
                max: MAX_FILTER_TERMS
            })
        ); // R-LIM-1
        // OneOf values count as terms.
        let big = F::one_of("a", (0..MAX_FILTER_TERMS).map(|i| i.to_string()));
        assert_eq!(
            big.validate(),
            Err(FilterError::TooManyTerms {
                max: MAX_FILTER_TERMS
            })
        ); // R-LIM-1
    }
}
