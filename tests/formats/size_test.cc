// formats/size.h: the one size grammar of the config, --set and every CLI flag.
#include <gtest/gtest.h>

#include <string>

#include "formats/size.h"

namespace kvtier {
namespace {

TEST(Size, AcceptsEveryUnit) {
  const struct {
    const char* text;
    uint64_t bytes;
  } cases[] = {
      {"0", 0},
      {"4096", 4096},
      {"4096B", 4096},
      {"4K", 4096},
      {"4KiB", 4096},
      {"64M", 64ull << 20},
      {"64MiB", 64ull << 20},
      {"4G", 4ull << 30},
      {"4GiB", 4ull << 30},
      {"2T", 2ull << 40},
      {"2TiB", 2ull << 40},
      {"10KB", 10000},
      {"10MB", 10000000},
      {"10GB", 10000000000ull},
      {"1TB", 1000000000000ull},
      {"1.5GiB", 1610612736ull},
      {"1.5G", 1610612736ull},
      {".5KiB", 512},
      {"2.KiB", 2048},
      {"1440KiB", 1474560},
      {" 4 GiB ", 4ull << 30},
      {"18446744073709551615", UINT64_MAX},
      {"16777215TiB", 16777215ull << 40},
  };
  for (const auto& c : cases) {
    auto v = ParseSize(c.text);
    ASSERT_TRUE(v.ok()) << c.text << ": " << v.status().ToString();
    EXPECT_EQ(*v, c.bytes) << c.text;
  }
}

TEST(Size, RefusesWithAMessage) {
  for (const char* bad : {"", " ", "GiB", ".", "4 GiBs", "-4", "+4", "4gib", "4g", "0x10",
                          "1e3", "inf", "nan", "4 G B", "4GiB4", "1..5G", "4Ki"}) {
    auto v = ParseSize(bad);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_TRUE(v.status().IsInvalid()) << bad;
    EXPECT_NE(v.status().message().find("bad size"), std::string::npos) << v.status().message();
  }
  for (const char* big : {"18446744073709551616", "16777216TiB", "99999999999TB", "20000000000.5G"}) {
    auto v = ParseSize(big);
    ASSERT_FALSE(v.ok()) << big;
    EXPECT_NE(v.status().message().find("too large"), std::string::npos) << v.status().message();
  }
  auto frac = ParseSize("1.5B");
  ASSERT_FALSE(frac.ok());
  EXPECT_NE(frac.status().message().find("whole number"), std::string::npos);
}

TEST(Size, FormatReadsBack) {
  EXPECT_EQ(FormatSize(4096), "4.0KiB");
  EXPECT_EQ(FormatSize(1000), "1000B");
  EXPECT_EQ(FormatSize(1610612736ull), "1.5GiB");
  EXPECT_EQ(FormatSize(1610612736ull, " "), "1.5 GiB");
  EXPECT_EQ(FormatSize(1000, " "), "1000 B");
  for (uint64_t b : {uint64_t{1} << 20, uint64_t{3} << 30, uint64_t{1} << 40}) {
    auto v = ParseSize(FormatSize(b));
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(*v, b);
  }
}

}  // namespace
}  // namespace kvtier
