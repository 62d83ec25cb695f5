#include "tools/bench/report.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>

namespace kvtier::bench {

std::string Fmt(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[512];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

Report::Report(std::string title, std::string command)
    : title_(std::move(title)), command_(std::move(command)) {}

std::string Report::MachineDescription() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::string cpu = "unknown CPU";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  return std::string(host) + ", " + cpu + ", " + std::to_string(cores) + " cores";
}

std::string Report::DefaultResultsPath() {
  if (const char* p = std::getenv("KVTIER_RESULTS")) return p;
#ifdef KVTIER_SOURCE_DIR
  return std::string(KVTIER_SOURCE_DIR) + "/bench/history/results.md";
#else
  return "bench/history/results.md";
#endif
}

std::string Report::ToMarkdown() const {
  std::ostringstream o;
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  o << "\n## " << title_ << "\n\n";
  o << "- machine: " << MachineDescription();
  if (!device_.empty()) o << ", " << device_;
  o << "\n- date: " << date << "\n- command: `" << command_ << "`\n\n";
  if (!cols_.empty()) {
    o << "|";
    for (const auto& c : cols_) o << " " << c << " |";
    o << "\n|";
    for (size_t i = 0; i < cols_.size(); ++i) o << "---|";
    o << "\n";
    for (const auto& r : rows_) {
      o << "|";
      for (const auto& c : r) o << " " << c << " |";
      o << "\n";
    }
  }
  if (!notes_.empty()) {
    o << "\n";
    for (const auto& n : notes_) o << n << "\n";
  }
  return o.str();
}

Status Report::Emit(const std::string& results_path) const {
  const std::string md = ToMarkdown();
  std::cout << md << std::flush;
  if (results_path.empty()) return Status::Ok();
  std::ofstream out(results_path, std::ios::app);
  if (!out) return Status::IoError("cannot append to " + results_path);
  out << md;
  return out ? Status::Ok() : Status::IoError("write to " + results_path + " failed");
}

}  // namespace kvtier::bench
