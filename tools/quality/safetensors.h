// Safetensors files: the reader (refusing every malformation with a clear Status), a
// writer, and the KV-dump convention kvtier's quality tools use.
//
// File format (https://huggingface.co/docs/safetensors): u64 little-endian N, then N
// bytes of UTF-8 JSON (an object; may be padded with trailing spaces), then the data
// section. Each JSON entry other than "__metadata__" is
//   "name": {"dtype": "BF16"|"F16"|"F32"|..., "shape": [d0, d1, ...],
//            "data_offsets": [begin, end]}
// with offsets relative to the data section. The reader accepts BF16, F16 and F32 and
// checks: N within the file and below 100 MB, JSON well-formed, every field present and
// typed, end - begin == product(shape) * dtype size, offsets inside the data section and
// no two tensors overlapping. Anything else is Invalid (or Unsupported for a valid but
// unsupported dtype), naming the tensor and the problem.
//
// KV-dump convention (written by client/python/kvtier/kvdump.py and `kvtierctl synth`):
//   layers.{i}.k   [tokens, kv_heads, head_dim]   keys of layer i (after RoPE)
//   layers.{i}.v   [tokens, kv_heads, head_dim]   values of layer i
//   layers.{i}.q   [queries, q_heads, head_dim]   optional: queries to score with
//                                                 (q_heads a multiple of kv_heads, GQA)
// Layers need not be contiguous, but every layer present must have both k and v, and all
// of them the same shape. Other tensor names are ignored.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/status.h"

namespace kvtier::quality {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
const char* DTypeName(DType d);         // "F32", "F16", "BF16"
bool ParseDType(std::string_view s, DType* out);  // also accepts lowercase
size_t DTypeSize(DType d);

// Element conversions (round-to-nearest-even when narrowing).
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);
float F16ToFloat(uint16_t h);
uint16_t FloatToF16(float f);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // offsets within the data section
  uint64_t end = 0;
  uint64_t numel() const;
};

// A parsed file over caller-owned bytes (e.g. a mapping); the bytes must outlive it.
class SafetensorsView {
 public:
  static StatusOr<SafetensorsView> Parse(std::span<const uint8_t> file);

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* Find(const std::string& name) const;
  // Converts a tensor to float32 (out gets numel() values). Invalid when a value is not
  // finite: KV caches never hold NaN/Inf, and the codecs refuse them.
  Status ReadFloat(const TensorInfo& t, std::vector<float>* out) const;

 private:
  std::span<const uint8_t> data_;  // the data section
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A read-only mapping of a whole file.
class MappedFile {
 public:
  static StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One tensor to write: float32 values converted to `dtype` on the way out.
struct TensorOut {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;
  std::span<const float> values;  // product(shape) values
};

// The complete file bytes (header padded with spaces to a multiple of 8).
StatusOr<std::vector<uint8_t>> SerializeSafetensors(
    const std::vector<TensorOut>& tensors, const std::map<std::string, std::string>& metadata = {});

// ---- The KV dump ---------------------------------------------------------------------

struct KvShape {
  uint64_t tokens = 0, kv_heads = 0, head_dim = 0;
};

// The layers of a dump, in ascending order, with their shapes checked.
struct KvDumpIndex {
  std::vector<int> layers;  // layer ids present
  KvShape shape;
  bool has_queries = false;          // every listed layer has layers.{i}.q
  uint64_t queries = 0, q_heads = 0; // shape of the q tensors when present
};

// Validates the convention above. `head_dim` must be a multiple of 32 (MXFP4 blocks are
// 32 values, NVFP4 blocks 16). `only` (when non-empty) selects layers; asking for a layer
// that is not in the file is Invalid.
StatusOr<KvDumpIndex> IndexKvDump(const SafetensorsView& f, const std::vector<int>& only = {});

// Parses "0,2,5-7" into {0,2,5,6,7}. Invalid on anything else.
StatusOr<std::vector<int>> ParseLayerList(const std::string& s);

}  // namespace kvtier::quality
