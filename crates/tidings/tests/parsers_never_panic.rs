//! Every parser a user can reach with a string or bytes — topic, pattern, the header filter
//! in its serialised (JSON) form — returns a typed error or a value, never a panic
//! (R-LIM-1, R-RT-2). Short in `cargo test`; set `TIDINGS_LONG=1` for a long run.

use proptest::prelude::*;
use proptest::test_runner::Config;
use tidings::*;

fn config() -> Config {
    let long = std::env::var_os("TIDINGS_LONG").is_some_and(|v| v != "0");
    Config {
        cases: if long { 200_000 } else { 256 },
        failure_persistence: None,
        ..Config::default()
    }
}

/// Strings near the grammar: words, wildcards, separators and a few hostile characters.
fn topicish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just(".".to_owned()),
            Just("*".to_owned()),
            Just("#".to_owned()),
            Just("\0".to_owned()),
            Just("é".to_owned()),
            "[a-zA-Z0-9_:-]{0,70}",
        ],
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

/// JSON texts near the filter's serialised form, including wrong types and deep nesting.
fn filterish() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        "[a-z]{0,4}".prop_map(|n| format!(r#"{{"exists":{{"name":"{n}"}}}}"#)),
        ("[a-z]{0,4}", "[a-z]{0,4}")
            .prop_map(|(n, v)| format!(r#"{{"equals":{{"name":"{n}","value":"{v}"}}}}"#)),
        ("[a-z]{0,4}", any::<f64>(), any::<f64>())
            .prop_map(|(n, a, b)| format!(r#"{{"range":{{"name":"{n}","min":{a},"max":{b}}}}}"#)),
        ("[a-z]{0,4}", prop::collection::vec("[a-z]{0,3}", 0..5)).prop_map(|(n, vs)| format!(
            r#"{{"one_of":{{"name":"{n}","values":{}}}}}"#,
            serde_json::to_string(&vs).unwrap()
        )),
        any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
        Just("null".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        Just(r#"{"range":{"name":"n","min":1e999}}"#.to_owned()),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6)
                .prop_map(|v| format!(r#"{{"all_of":[{}]}}"#, v.join(","))),
            prop::collection::vec(inner.clone(), 0..6)
                .prop_map(|v| format!(r#"{{"any_of":[{}]}}"#, v.join(","))),
            inner.prop_map(|f| format!(r#"{{"not":{f}}}"#)),
        ]
    })
}

fn check_filter(json: &str) {
    if let Ok(f) = serde_json::from_str::<HeaderFilter>(json) {
        let _ = f.validate();
        let mut h = Headers::new();
        h.insert("n", "5");
        h.insert("a", "");
        let _ = f.matches(&h);
        let _ = serde_json::to_string(&f);
    }
}

proptest! {
    #![proptest_config(config())]

    // R-LIM-1, R-RT-2: arbitrary text is a topic/pattern or a typed error.
    #[test]
    fn topics_and_patterns_from_any_string(s in any::<String>()) {
        let _ = Topic::new(&s).map_err(|e| e.to_string());
        let _ = Pattern::new(&s).map_err(|e| e.to_string());
    }

    // R-LIM-1, R-RT-2: strings near the grammar, and matching what parses.
    #[test]
    fn topics_and_patterns_near_the_grammar(s in topicish(), t in topicish()) {
        let topic = Topic::new(&t);
        if let (Ok(p), Ok(t)) = (Pattern::new(&s), topic) {
            let _ = p.matches(&t);
            prop_assert_eq!(p.is_literal(), p.as_topic().is_some()); // R-RT-2
        }
    }

    // R-LIM-1: arbitrary bytes and text as a serialised header filter.
    #[test]
    fn header_filter_from_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(s) = std::str::from_utf8(&bytes) {
            check_filter(s);
        }
        let _ = serde_json::from_slice::<HeaderFilter>(&bytes);
    }

    // R-LIM-1: JSON shaped like filters, nested, with wrong types and odd numbers.
    #[test]
    fn header_filter_near_its_serialised_form(json in filterish()) {
        check_filter(&json);
    }

    // R-LIM-1: publish validation through the public builder never panics.
    #[test]
    fn messages_from_any_fields(topic in topicish(), reply in topicish(), corr in ".{0,40}") {
        let _ = Message::to(topic).reply_to(reply).correlation_id(corr).build_detached();
    }
}

#[test]
fn deeply_nested_filter_json_is_an_error_not_a_crash() {
    let depth = 100_000;
    let json = format!(
        "{}{}{}",
        r#"{"not":"#.repeat(depth),
        r#"{"exists":{"name":"a"}}"#,
        "}".repeat(depth)
    );
    assert!(serde_json::from_str::<HeaderFilter>(&json).is_err()); // R-LIM-1
}
