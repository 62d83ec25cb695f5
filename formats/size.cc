#include "formats/size.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

namespace kvtier {

namespace {

struct Unit {
  std::string_view name;
  uint64_t bytes;
};
constexpr Unit kUnits[] = {
    {"", 1},
    {"B", 1},
    {"K", 1ull << 10},
    {"KiB", 1ull << 10},
    {"M", 1ull << 20},
    {"MiB", 1ull << 20},
    {"G", 1ull << 30},
    {"GiB", 1ull << 30},
    {"T", 1ull << 40},
    {"TiB", 1ull << 40},
    {"KB", 1000ull},
    {"MB", 1000ull * 1000},
    {"GB", 1000ull * 1000 * 1000},
    {"TB", 1000ull * 1000 * 1000 * 1000},
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

StatusOr<uint64_t> ParseSize(std::string_view text) {
  auto bad = [&] {
    return Status::Invalid("bad size \"" + std::string(text) +
                           "\" (expected e.g. 4096, 64MiB, 4G, 1.5GiB, 10GB; units B, K/KiB, "
                           "M/MiB, G/GiB, T/TiB, KB, MB, GB, TB)");
  };
  const std::string_view s = Trim(text);
  size_t n = 0;
  size_t int_digits = 0, frac_digits = 0;
  while (n < s.size() && IsDigit(s[n])) ++n, ++int_digits;
  const size_t int_end = n;
  bool dot = false;
  if (n < s.size() && s[n] == '.') {
    dot = true;
    ++n;
    while (n < s.size() && IsDigit(s[n])) ++n, ++frac_digits;
  }
  if (int_digits + frac_digits == 0) return bad();
  const std::string_view number = s.substr(0, n);
  const std::string_view unit_text = Trim(s.substr(n));
  const Unit* unit = nullptr;
  for (const Unit& u : kUnits) {
    if (u.name == unit_text) unit = &u;
  }
  if (unit == nullptr) return bad();
  auto too_large = [&] { return Status::Invalid("size \"" + std::string(text) + "\" is too large"); };

  if (!dot || frac_digits == 0) {
    // Whole numbers are exact, up to 2^64 - 1 bytes.
    uint64_t v = 0;
    const auto r = std::from_chars(s.data(), s.data() + int_end, v);
    if (r.ec == std::errc::result_out_of_range) return too_large();
    if (r.ec != std::errc() || r.ptr != s.data() + int_end) return bad();
    if (v != 0 && unit->bytes > UINT64_MAX / v) return too_large();
    return v * unit->bytes;
  }
  const std::string num(number);
  const double v = std::strtod(num.c_str(), nullptr);
  if (!std::isfinite(v)) return bad();
  const double bytes = v * static_cast<double>(unit->bytes);
  if (bytes >= 18446744073709551616.0) return too_large();
  if (bytes != std::floor(bytes)) {
    return Status::Invalid("size \"" + std::string(text) + "\" is not a whole number of bytes");
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatSize(uint64_t bytes, std::string_view sep) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f", v);
  return std::string(buf) + std::string(sep) + units[u];
}

}  // namespace kvtier
