// Benchmark report: a table printed to stdout and appended to bench/history/results.md
// (the log of runs; bench/README.md holds the current table of each suite).
//
// Every kvtier benchmark measures its baseline in the same run and reports ratios
// (absolute times on shared machines are noise; ratios hold). Report names the machine
// (host name, CPU model, GPU when given) and the date, then the table.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "formats/status.h"

namespace kvtier::bench {

// Seconds since t0 (steady clock), and the median of a sample (0 when empty): what every
// suite times with.
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class Report {
 public:
  // title: e.g. "codec: CPU NVFP4 quantize/dequantize"; command: how to reproduce.
  Report(std::string title, std::string command);

  void SetColumns(std::vector<std::string> cols) { cols_ = std::move(cols); }
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void AddNote(std::string note) { notes_.push_back(std::move(note)); }
  // Extra machine description (e.g. "NVIDIA H200"), appended to the CPU line.
  void SetDevice(std::string device) { device_ = std::move(device); }

  std::string ToMarkdown() const;
  // Prints the markdown to stdout and appends it to `results_path` (default:
  // $KVTIER_RESULTS or <source>/bench/history/results.md). An empty path only prints.
  Status Emit(const std::string& results_path) const;

  static std::string DefaultResultsPath();
  static std::string MachineDescription();

 private:
  std::string title_, command_, device_;
  std::vector<std::string> cols_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::string> notes_;
};

// printf-style formatting into a std::string.
std::string Fmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// The --results and --no-append lines of a suite's usage text (cli::Command::usage), the
// same for every suite that writes a table.
inline constexpr char kResultsUsage[] =
    "  --results FILE   append the table to FILE (default: $KVTIER_RESULTS, else the source\n"
    "                   tree's bench/history/results.md)\n"
    "  --no-append      print the table only";

}  // namespace kvtier::bench
