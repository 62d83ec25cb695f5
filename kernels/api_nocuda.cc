// The C ABI of kernels/include/kvtier/kernels.h in a build without CUDA: every launcher
// says so (KVT_UNSUPPORTED) instead of being absent, so callers link the same way. The
// table of decode shapes (kvt_decode_shapes, kvt_decode_supports) answers as in a CUDA
// build, so a model can be checked where no GPU is.
#include <string>

#include "kernels/include/kvtier/kernels.h"
#include "kernels/support.h"

namespace {
thread_local std::string g_error;
int NoCuda() {
  g_error = "kvtier was built without CUDA: GPU kernels are unavailable";
  return KVT_UNSUPPORTED;
}
}  // namespace

extern "C" {
const char* kvt_last_error(void) { return g_error.c_str(); }
uint32_t kvt_decode_shapes(kvt_decode_shape* out, uint32_t capacity) {
  return kvtier::kernels::DecodeShapes(out, capacity);
}
int kvt_decode_supports(uint32_t format, uint32_t head_dim, uint32_t group, uint32_t block_tokens) {
  g_error = kvtier::kernels::DecodeUnsupportedReason(format, head_dim, group, block_tokens);
  if (!g_error.empty()) {
    g_error = "decode: " + g_error;
    return KVT_UNSUPPORTED;
  }
  return KVT_OK;
}
int kvt_check_pool(const kvt_pool*) { return NoCuda(); }
int kvt_quantize_append(const kvt_pool*, const kvt_quantize_params*, void*) { return NoCuda(); }
uint64_t kvt_decode_workspace_bytes(const kvt_pool*, const kvt_decode_params*) { return 0; }
int32_t kvt_decode_num_splits(const kvt_pool*, const kvt_decode_params*) { return 0; }
int kvt_decode(const kvt_pool*, const kvt_decode_params*, void*) { return NoCuda(); }
int kvt_decode_read_probe(const kvt_pool*, const kvt_decode_params*, void*) { return NoCuda(); }
int kvt_dequantize_pages(const kvt_pool*, const kvt_dequant_params*, void*) { return NoCuda(); }
int kvt_read_bandwidth_probe(const void*, uint64_t, uint32_t*, void*) { return NoCuda(); }
int kvt_engine_pages(const kvt_engine_pages_params*, void*) { return NoCuda(); }
}
