// The scale contract: everything that decides what a block's bytes mean.
//
// Two blocks may only be compared, served or aliased when their contracts are equal,
// and equality is decided by the contract id: XXH3-64 of the canonical serialization
// below. A lookup under an unknown contract is a miss, never a conversion. Changing a
// global scale (e.g. after `kvtierctl calibrate`) gives a new id, so old blocks stay
// apart from new ones.
//
// Canonical serialization (version 1), all integers little-endian:
//   "KVTC" | u16 version=1 | str model_id | str model_revision | str tokenizer_revision
//   | u32 L | u32 H | u32 D | u32 T | u32 tp_rank | u32 tp_size
//   | u8 kv_format | u8 scale_rule | u8 v_scale_swizzle | u8 reserved=0
//   | u32 layout_version | f32 k_scale[L] | f32 v_scale[L]
// where str = u32 byte length + UTF-8 bytes (at most 256). Float scales are hashed by
// their IEEE bits, so 1.0 and 1.0000001 are different contracts.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/layout.h"
#include "formats/nvfp4_math.h"
#include "formats/status.h"

namespace kvtier {

inline constexpr uint32_t kLayoutVersion = 1;           // the page layout of layout.h
inline constexpr uint16_t kContractSerialVersion = 1;   // bump when the layout above changes
inline constexpr size_t kMaxContractString = 256;

struct ScaleContract {
  std::string model_id;            // e.g. "meta-llama/Llama-3.1-8B". Default: "" (refused)
  std::string model_revision;      // weights revision / commit. Default: ""
  std::string tokenizer_revision;  // tokenizer revision. Default: ""
  Geometry geometry;               // L, H, D, T. Default: all zero (refused)
  uint32_t tp_rank = 0;            // this rank. Default: 0
  uint32_t tp_size = 1;            // tensor-parallel size. Default: 1
  KvFormat format = KvFormat::kNvfp4;  // element format. Default: nvfp4
  nvfp4::ScaleRule scale_rule = nvfp4::ScaleRule::kMax6;  // NVFP4 only. Default: max6
  bool v_scale_swizzle = false;    // 4-token V-scale swizzle of some Blackwell readers.
                                   // Default: false (linear scales)
  uint32_t layout_version = kLayoutVersion;  // Default: kLayoutVersion
  std::vector<float> k_scales;     // per-layer K dequantization multiplier, size L.
  std::vector<float> v_scales;     // per-layer V dequantization multiplier, size L.

  // Sets k_scales/v_scales to L copies of 1.0 (uncalibrated).
  void SetUnitScales();

  Status Validate() const;

  // Canonical bytes (see the header comment). Only meaningful for a valid contract.
  std::vector<uint8_t> Serialize() const;
  // Parses canonical bytes; Invalid on any malformation (and validates the result).
  static StatusOr<ScaleContract> Deserialize(std::span<const uint8_t> bytes);

  // XXH3-64 of Serialize().
  uint64_t Id() const;

  size_t block_bytes() const { return BlockBytes(format, geometry); }
  size_t slot_bytes() const { return SlotBytes(format, geometry); }

  bool operator==(const ScaleContract&) const = default;
};

// The handle of a contract in the shared namespace (docs/security.md): what a shared
// registration (kvtier_register_contract_shared) answers, and the id its blocks are
// named by. XXH3-64 of a fixed tag and the contract id; never 0 and, but for a 2^-64
// chance, never the contract id itself.
uint64_t SharedContractId(uint64_t contract_id);

// 16 lowercase hex digits.
std::string ContractIdHex(uint64_t id);
bool ParseContractIdHex(std::string_view hex, uint64_t* id);

}  // namespace kvtier
