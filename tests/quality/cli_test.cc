// kvtierctl synth / analyze / calibrate / contract through the built binary: good runs,
// and bad input giving a non-zero exit, one line on stderr and no output file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace {

namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out, err;
};

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvtier_quality_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result Run(const std::string& args, const std::string& exe = KVTIER_BIN_DIR "/kvtierctl") {
    const std::string cmd = exe + " " + args + " >" + (dir_ / "stdout").string() + " 2>" +
                            (dir_ / "stderr").string();
    const int st = std::system(cmd.c_str());
    Result r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = Slurp(dir_ / "stdout");
    r.err = Slurp(dir_ / "stderr");
    return r;
  }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  // A safetensors file with the given header JSON and zeroed data.
  void WriteSafetensors(const std::string& name, const std::string& header, size_t data,
                        uint64_t claimed = ~0ull) {
    std::string b(8, '\0');
    const uint64_t n = claimed == ~0ull ? header.size() : claimed;
    std::memcpy(b.data(), &n, 8);
    Write(name, b + header + std::string(data, '\0'));
  }
  void ExpectOneLineFailure(const Result& r, const std::string& words) {
    EXPECT_NE(r.rc, 0);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  fs::path dir_;
};

TEST_F(Cli, SynthAnalyzeCalibrateContract) {
  Result s = Run("synth --out " + P("kv.safetensors") +
                 " --layers 3 --kv-heads 2 --head-dim 64 --tokens 96 --queries 4");
  ASSERT_EQ(s.rc, 0) << s.err;
  ASSERT_TRUE(fs::exists(P("kv.safetensors")));

  Result a = Run("analyze --in " + P("kv.safetensors") + " --json --layers 0,2 --plot " + P("h.svg"));
  ASSERT_EQ(a.rc, 0) << a.err;
  const auto j = nlohmann::json::parse(a.out);
  ASSERT_EQ(j["layers"].size(), 2u);
  EXPECT_EQ(j["layers"][1]["layer"], 2);
  EXPECT_NE(Slurp(P("h.svg")).find("<svg"), std::string::npos);
  Result t = Run("analyze --in " + P("kv.safetensors") + " --unit-scales --random-queries");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("random N(0,1)"), std::string::npos);
  EXPECT_NE(t.out.find("worst heads"), std::string::npos);

  Result c = Run("calibrate --in " + P("kv.safetensors") + " --out " + P("scales.toml"));
  ASSERT_EQ(c.rc, 0) << c.err;
  ASSERT_TRUE(fs::exists(P("scales.toml")));
  EXPECT_FALSE(fs::exists(P("scales.toml.tmp")));

  const std::string geo = "contract id --model m/x --layers 3 --kv-heads 2 --head-dim 64 --block-tokens 16";
  Result id0 = Run(geo);
  Result id1 = Run(geo + " --scales " + P("scales.toml"));
  Result id1b = Run(geo + " --scales " + P("scales.toml"));
  ASSERT_EQ(id0.rc, 0) << id0.err;
  ASSERT_EQ(id1.rc, 0) << id1.err;
  EXPECT_EQ(id0.out.size(), 17u);  // 16 hex digits and a newline
  EXPECT_NE(id0.out, id1.out);
  EXPECT_EQ(id1.out, id1b.out);

  Result p = Run("calibrate --in " + P("kv.safetensors") + " --out " + P("p.toml") + " --percentile 99.9");
  ASSERT_EQ(p.rc, 0) << p.err;
  Result id2 = Run(geo + " --scales " + P("p.toml"));
  EXPECT_NE(id2.out, id1.out);

  Result an = Run("analyze --in " + P("kv.safetensors") + " --scales " + P("scales.toml"));
  EXPECT_EQ(an.rc, 0) << an.err;

  // The scales file belongs to 3 layers.
  ExpectOneLineFailure(Run("contract id --model m --layers 4 --kv-heads 2 --head-dim 64 "
                           "--block-tokens 16 --scales " + P("scales.toml")),
                       "has scales for 3 layers");
}

TEST_F(Cli, BadSafetensorsIsRefusedAndWritesNothing) {
  const std::string ok = R"({"layers.0.k":{"dtype":"F32","shape":[2,1,32],"data_offsets":[0,256]},)"
                         R"("layers.0.v":{"dtype":"F32","shape":[2,1,32],"data_offsets":[256,512]}})";
  WriteSafetensors("good.safetensors", ok, 512);
  ASSERT_EQ(Run("calibrate --in " + P("good.safetensors") + " --out " + P("g.toml")).rc, 0);

  WriteSafetensors("len.safetensors", ok, 512, 1u << 20);
  WriteSafetensors("dtype.safetensors",
                   R"({"layers.0.k":{"dtype":"I32","shape":[2,1,32],"data_offsets":[0,256]}})", 256);
  WriteSafetensors("shape.safetensors",
                   R"({"layers.0.k":{"dtype":"BF16","shape":[2,1,32],"data_offsets":[0,256]}})", 256);
  const std::pair<const char*, const char*> cases[] = {
      {"len.safetensors", "bad header length"},
      {"dtype.safetensors", "dtype I32 is not supported"},
      {"shape.safetensors", "shape mismatch"},
  };
  for (const auto& [file, words] : cases) {
    SCOPED_TRACE(file);
    ExpectOneLineFailure(Run("calibrate --in " + P(file) + " --out " + P("s.toml")), words);
    EXPECT_FALSE(fs::exists(P("s.toml")));
    EXPECT_FALSE(fs::exists(P("s.toml.tmp")));
    ExpectOneLineFailure(Run("analyze --in " + P(file) + " --plot " + P("x.svg")), words);
    EXPECT_FALSE(fs::exists(P("x.svg")));
  }
  ExpectOneLineFailure(Run("analyze --in " + P("missing.safetensors")), "cannot open");
}

TEST_F(Cli, BadOptionsAreRefused) {
  ExpectOneLineFailure(Run("synth --out " + P("k.safetensors") + " --head-dim 48"), "head_dim");
  EXPECT_FALSE(fs::exists(P("k.safetensors")));
  ExpectOneLineFailure(Run("synth --out " + P("k.safetensors") + " --layers x"), "--layers");
  ExpectOneLineFailure(Run("synth --out " + P("k.safetensors") + " --dtype i8"), "--dtype");
  EXPECT_FALSE(fs::exists(P("k.safetensors")));
  ASSERT_EQ(Run("synth --out " + P("kv.safetensors") + " --layers 1 --tokens 32 --head-dim 32").rc, 0);
  Result r = Run("calibrate --in " + P("kv.safetensors") + " --out " + P("s.toml") + " --percentile 0");
  ExpectOneLineFailure(r, "percentile");
  EXPECT_EQ(r.rc, 2);
  EXPECT_FALSE(fs::exists(P("s.toml")));
  ExpectOneLineFailure(Run("calibrate --in " + P("kv.safetensors")), "missing --out");
  ExpectOneLineFailure(Run("analyze --in " + P("kv.safetensors") + " --bogus 1"), "unknown option --bogus");
  ExpectOneLineFailure(Run("analyze --in " + P("kv.safetensors") + " --layers 3"), "layer 3 is not in the file");
  ExpectOneLineFailure(Run("analyze --in " + P("kv.safetensors") + " --rank-codec int4"), "--rank-codec");
  ExpectOneLineFailure(Run("analyze --in " + P("kv.safetensors") + " --scales " + P("nope.toml")), "nope.toml");
  Write("bad.toml", "[contract]\nk_scales = [1.0]\nv_scales = [-2.0]\n");
  ExpectOneLineFailure(Run("contract id --model m --layers 1 --kv-heads 1 --head-dim 32 --block-tokens 16 "
                           "--scales " + P("bad.toml")),
                       "v_scales[0]");
  ExpectOneLineFailure(Run("contract id --model m --layers 1 --kv-heads 1 --head-dim 30 --block-tokens 16"),
                       "contract");
  ExpectOneLineFailure(Run("contract frobnicate"), "unknown subcommand");
}

TEST_F(Cli, PythonKvdumpIsReadable) {
  // client/python/kvtier/kvdump.py with numpy (torch is not installed on the build machines).
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no numpy for /usr/bin/python3 (apt-get install python3-numpy)";
  }
  const std::string py =
      "import sys; sys.path.insert(0, '" KVTIER_SOURCE_DIR "/client/python/kvtier');"
      "import numpy as np, kvdump;"
      "rng = np.random.default_rng(0);"
      "ks = [rng.standard_normal((40, 2, 64)).astype(np.float32) for _ in range(2)];"
      "vs = [rng.standard_normal((40, 2, 64)).astype(np.float16) for _ in range(2)];"
      "kvdump.write_kv_dump('" + P("py.safetensors") + "', ks, vs, metadata={'model': 'test'})";
  Write("w.py", py);
  Result w = Run(P("w.py"), "/usr/bin/python3");
  ASSERT_EQ(w.rc, 0) << w.err;
  Result a = Run("analyze --in " + P("py.safetensors") + " --json");
  ASSERT_EQ(a.rc, 0) << a.err;
  const auto j = nlohmann::json::parse(a.out);
  EXPECT_EQ(j["shape"]["tokens"], 40);
  EXPECT_EQ(j["shape"]["kv_heads"], 2);
  EXPECT_EQ(j["layers"].size(), 2u);
  // K is F32: the FP32 reference is the written data; V went through F16.
  EXPECT_GT(j["summary"]["nvfp4-max6"]["k"]["nmse"].get<double>(), 0.0);
  // Mismatched shapes are refused by the writer.
  Write("bad.py", "import sys; sys.path.insert(0, '" KVTIER_SOURCE_DIR "/client/python/kvtier');"
                  "import numpy as np, kvdump;"
                  "kvdump.write_kv_dump('" + P("bad.safetensors") + "', [np.zeros((4,2,64),np.float32)],"
                  " [np.zeros((4,2,32),np.float32)])");
  Result b = Run(P("bad.py"), "/usr/bin/python3");
  EXPECT_NE(b.rc, 0);
  EXPECT_FALSE(fs::exists(P("bad.safetensors")));
}

}  // namespace
