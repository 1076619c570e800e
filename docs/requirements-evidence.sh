#!/bin/sh
# Lists, for each requirement id, the test code that names it: the evidence lines of
# docs/requirements.md. Run from anywhere; it works from the repository root.
#
#   sh docs/requirements-evidence.sh              every id that docs/requirements.md lists
#   sh docs/requirements-evidence.sh R-DEL-4      one id (or several)
#   sh docs/requirements-evidence.sh --unknown    ids cited in the code or docs that
#                                                 docs/requirements.md does not list (typos,
#                                                 stale ids), with file:line
#
# Evidence is code that names the id (`// R-DEL-4`):
#   tests:      files under crates/*/tests/
#   unit tests: crates/*/src files, counting only the text of their #[cfg(test)] modules
#               (and files that are test-only modules, e.g. `#[cfg(test)] mod fuzz;`)
#   suites:     functions of the tidings-testkit suites (crates/tidings-testkit/src/*suite.rs)
#               whose doc comment or body names the id
# A range such as `R-LOG-1..4` names only the ids it spells out (here R-LOG-1).
set -eu
export LC_ALL=C
cd "$(dirname "$0")/.."

doc=docs/requirements.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ "${1:-}" = "--unknown" ]; then
    grep -ohE '^### R-[A-Z]+-[0-9]+' "$doc" | cut -c5- | sort -u >"$tmp/known"
    grep -rnoE 'R-[A-Z]+-[0-9]+' crates docs README.md BENCHMARKS.md |
        grep -v "^$doc:" |
        while IFS= read -r hit; do
            id=${hit##*:}
            grep -qxF "$id" "$tmp/known" || echo "$hit"
        done
    exit 0
fi

# The text of every #[cfg(test)] module under crates/*/src, as file:line:text.
find crates/*/src -name '*.rs' | sort | xargs awk '
    FNR == 1 { pending = 0; intest = 0; depth = 0 }
    function braces(s,   o, c) { o = gsub(/\{/, "{", s); c = gsub(/\}/, "}", s); return o - c }
    intest {
        print FILENAME ":" FNR ":" $0
        depth += braces($0)
        if (depth <= 0) intest = 0
        next
    }
    pending && /^[ \t]*(pub(\([a-z]+\))? )?mod [A-Za-z0-9_]+[ \t]*;/ {
        name = $0; sub(/^[ \t]*(pub(\([a-z]+\))? )?mod /, "", name); sub(/[ \t]*;.*/, "", name)
        dir = FILENAME; sub(/\/[^\/]*$/, "", dir)
        if (FILENAME !~ /\/(lib|main|mod)\.rs$/) { dir = FILENAME; sub(/\.rs$/, "", dir) }
        print "@file " dir "/" name ".rs"
        print "@file " dir "/" name "/mod.rs"
        pending = 0; next
    }
    pending && /^[ \t]*(pub(\([a-z]+\))? )?mod [A-Za-z0-9_]+[ \t]*\{/ {
        print FILENAME ":" FNR ":" $0
        intest = 1; depth = braces($0); pending = 0
        if (depth <= 0) intest = 0
        next
    }
    pending && /^[ \t]*#\[/ { next }
    { pending = 0 }
    /^[ \t]*#\[cfg\((test|all\(test|any\(test)[,)]/ { pending = 1 }
' >"$tmp/unit.raw"
grep -v '^@file ' "$tmp/unit.raw" >"$tmp/unit" || true
grep '^@file ' "$tmp/unit.raw" | cut -c7- | while IFS= read -r f; do
    if [ -f "$f" ]; then grep -nH '' "$f" >>"$tmp/unit"; fi
done

# Every line of the testkit suites inside (or documenting) a top-level `pub fn`, as
# file:function:text.
awk '
    FNR == 1 { cur = ""; ndoc = 0 }
    /^\/\/\// { doc[++ndoc] = $0; next }
    /^pub fn [A-Za-z0-9_]+/ {
        name = $0; sub(/^pub fn /, "", name); sub(/[^A-Za-z0-9_].*/, "", name)
        cur = name
        for (i = 1; i <= ndoc; i++) print FILENAME ":" cur ":" doc[i]
        ndoc = 0
        print FILENAME ":" cur ":" $0
        next
    }
    /^#\[/ { next }
    /^[^ \t]/ { ndoc = 0; if ($0 !~ /^\}/) cur = ""; else { if (cur != "") print FILENAME ":" cur ":" $0; cur = ""; next } }
    cur != "" { print FILENAME ":" cur ":" $0 }
' crates/tidings-testkit/src/*suite.rs >"$tmp/suites"

if [ "$#" -gt 0 ]; then
    ids=$*
else
    ids=$(grep -ohE '^### R-[A-Z]+-[0-9]+' "$doc" | cut -c5-)
fi

list() { # backquoted, comma-separated
    sed 's/.*/`&`/' | paste -sd, - | sed 's/,/, /g'
}

for id in $ids; do
    re="$id\\b"
    tests=$(grep -rlE "$re" crates/*/tests 2>/dev/null | sort | list)
    unit=$(grep -E "^[^:]*:[0-9]+:.*$re" "$tmp/unit" | cut -d: -f1 | sort -u | list)
    suites=$(grep -E "^[^:]*:[A-Za-z0-9_]+:.*$re" "$tmp/suites" |
        awk -F: '{ f = $1; sub(/.*\//, "", f); sub(/\.rs$/, "", f); print f "::" $2 }' | sort -u | list)
    echo "$id"
    if [ -z "$tests$unit$suites" ]; then
        echo "- Tests: **none name this id yet.**"
    else
        if [ -n "$tests" ]; then echo "- Tests: $tests"; fi
        if [ -n "$unit" ]; then echo "- Unit tests (\`#[cfg(test)]\` modules): $unit"; fi
        if [ -n "$suites" ]; then echo "- Testkit suites: $suites"; fi
    fi
    echo
done
