#include "testing/test_point.h"

#include <mutex>

namespace kvtier {

namespace {
std::mutex g_mu;
TestPointCallback& Cb() {
  static TestPointCallback cb;
  return cb;
}
}  // namespace

void SetTestPointCallback(TestPointCallback cb) {
  std::lock_guard<std::mutex> l(g_mu);
  Cb() = std::move(cb);
}


void RunTestPoint(std::string_view name) {
  TestPointCallback cb;
  {
    std::lock_guard<std::mutex> l(g_mu);
    cb = Cb();
  }
  if (cb) cb(name);
}

}  // namespace kvtier
