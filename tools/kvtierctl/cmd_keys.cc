// kvtierctl keys --contract HEX16 --block-tokens T --in TOKENS.u32
// Prints the key chain of a token file (raw little-endian u32 token ids): one key per
// full block, 32 lowercase hex digits of the canonical form per line.
#include <cstring>
#include <string>
#include <vector>

#include "formats/contract.h"
#include "formats/keys.h"
#include "tools/cli.h"

namespace kvtier {
namespace {

using cli::Fail;

int Run(const std::vector<std::string>& argv) {
  if (!argv.empty() && argv[0] == "--help") {
    std::puts("usage: kvtierctl keys --contract HEX16 --block-tokens T --in TOKENS.u32");
    return 0;
  }
  auto args = cli::Args::Parse(argv);
  if (!args.ok()) return Fail("keys: " + args.status().message(), 2);
  if (auto s = args->CheckKnown({"contract", "block-tokens", "in"}); !s.ok()) {
    return Fail("keys: " + s.message(), 2);
  }
  if (!args->positional().empty()) {
    return Fail("keys: unexpected argument '" + args->positional()[0] + "'", 2);
  }
  auto contract = args->Require("contract");
  if (!contract.ok()) return Fail("keys: " + contract.status().message(), 2);
  uint64_t cid;
  if (!ParseContractIdHex(*contract, &cid)) {
    return Fail("keys: --contract must be 16 hex digits, got '" + *contract + "'", 2);
  }
  auto t = args->GetInt("block-tokens", std::nullopt);
  if (!t.ok()) return Fail("keys: " + t.status().message(), 2);
  if (*t < 1 || *t > 1024) {
    return Fail("keys: --block-tokens must be in [1, 1024], got " + std::to_string(*t), 2);
  }
  auto in = args->Require("in");
  if (!in.ok()) return Fail("keys: " + in.status().message(), 2);
  auto bytes = cli::ReadFile(*in);
  if (!bytes.ok()) return Fail("keys: " + bytes.status().message());
  if (bytes->size() % 4 != 0) {
    return Fail("keys: " + *in + ": " + std::to_string(bytes->size()) +
                " bytes is not a whole number of u32 token ids");
  }
  std::vector<uint32_t> tokens(bytes->size() / 4);
  std::memcpy(tokens.data(), bytes->data(), bytes->size());
  const auto keys = KeyChain(cid, tokens, static_cast<uint32_t>(*t));
  std::string outtext;
  for (const auto& k : keys) outtext += k.ToHex() + "\n";
  std::fputs(outtext.c_str(), stdout);
  return 0;
}

cli::CommandRegistrar reg("keys", "key chain of a u32 token file under a contract id", Run);

}  // namespace
}  // namespace kvtier
