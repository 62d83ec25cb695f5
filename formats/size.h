// Byte sizes as people write them: the one grammar of the config file, `--set` overrides
// and every command-line flag that takes a size.
//
//   size   := spaces? number spaces? unit? spaces?
//   number := digits ["." digits] | "." digits      (plain decimal: no sign, hex, exponent)
//   unit   := B | K | KiB | M | MiB | G | GiB | T | TiB     (powers of 1024)
//           | KB | MB | GB | TB                             (powers of 1000)
//
// Units are case-sensitive ("4gib" is refused: "mb" would be ambiguous). The result must be
// a whole number of bytes ("1.5B" is refused) and fit in 64 bits.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "formats/status.h"

namespace kvtier {

// Parses "4096", "4K", "512MiB", "1.5GiB", "10GB". Invalid, with a message quoting the
// text and the accepted units, on anything else.
StatusOr<uint64_t> ParseSize(std::string_view text);

// "4096B", "512.0MiB", "1.5GiB": for logs and messages (one decimal, powers of 1024).
// `sep` goes between the number and the unit ("1.5 GiB" for tables).
std::string FormatSize(uint64_t bytes, std::string_view sep = "");

}  // namespace kvtier
