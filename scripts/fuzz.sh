#!/usr/bin/env bash
# Coverage-guided fuzzing of every target of crates/space-fuzz with libFuzzer (cargo fuzz, on
# the stable toolchain through RUSTC_BOOTSTRAP=1), each for SPACE_FUZZ_SECONDS (default 60).
# The checked-in seeds are fuzz/corpus/<target>/; what the fuzzer finds new goes to
# target/fuzz-corpus/<target>/ (kept between runs), a failing input to fuzz/artifacts/<target>/.
# Prints a table: executions, coverage (libFuzzer's `cov`, edges) and corpus size per target.
# Usage: scripts/fuzz.sh [target...]   (default: all)
set -euo pipefail

cd "$(dirname "$0")/.."
log() { printf '[fuzz] %s\n' "$*" >&2; }
seconds=${SPACE_FUZZ_SECONDS:-60}
cache=${SPACE_CACHE:-$HOME/.cache/space}
version=0.13.2
root="$cache/tools/cargo-fuzz-$version"
if ! [[ -x $root/bin/cargo-fuzz ]]; then
    log "installing cargo-fuzz $version from crates.io into $root (a few minutes, once)"
    cargo install --quiet --locked --root "$root" "cargo-fuzz@$version"
fi
export PATH="$root/bin:$PATH" RUSTC_BOOTSTRAP=1

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    mapfile -t targets < <(ls fuzz/fuzz_targets | sed 's/\.rs$//')
fi
log "building ${#targets[@]} targets with sanitizer coverage (the first build takes ~10 min)"

for t in "${targets[@]}"; do
    (cd fuzz && cargo fuzz build -O "$t" >/dev/null 2>&1) || { log "building $t failed"; exit 1; }
done

rows=()
failed=0
for t in "${targets[@]}"; do
    work="target/fuzz-corpus/$t"
    mkdir -p "$work" "fuzz/artifacts/$t"
    log "$t: ${seconds} s"
    out=$(mktemp)
    set +e
    (cd fuzz && cargo fuzz run -O "$t" "../$work" "corpus/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1) >"$out" 2>&1
    rc=$?
    set -e
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n1)
    cov=$(grep -oE 'cov: [0-9]+' "$out" | tail -n1 | cut -d' ' -f2)
    units=$(ls "$work" | wc -l)
    if [[ $rc -ne 0 ]]; then
        failed=1
        log "$t FAILED (exit $rc); the input is in fuzz/artifacts/$t; the end of its log:"
        tail -n 30 "$out" >&2
    fi
    rows+=("$(printf '| %-18s | %12s | %8s | %8s | %-6s |' "$t" "${execs:-?}" "${cov:-?}" "$units" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)")")
    log "$t: ${execs:-?} executions, coverage ${cov:-?}, corpus $units"
    rm -f "$out"
done
printf '\nFuzzing, %s s per target\n' "$seconds"
printf '| %-18s | %12s | %8s | %8s | %-6s |\n' target executions coverage corpus result
printf '| %-18s | %12s | %8s | %8s | %-6s |\n' ------------------ ------------ -------- -------- ------
printf '%s\n' "${rows[@]}"
exit $failed
