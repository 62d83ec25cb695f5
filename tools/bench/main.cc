// kvtier-bench: benchmark programs. Each suite (bench_*.cc beside this file) measures
// its baseline in the same run, prints ratios and appends its table to
// bench/history/results.md (bench/report.h).
#include "tools/cli.h"

int main(int argc, char** argv) { return kvtier::cli::Main("kvtier-bench", argc, argv); }
