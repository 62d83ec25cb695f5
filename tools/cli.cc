#include "tools/cli.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>

#include "kvtier/version.h"

namespace kvtier::cli {

namespace {
std::string g_program = "kvtier";
std::string g_socket;
}

std::string SocketPath() {
  if (!g_socket.empty()) return g_socket;
  if (const char* e = std::getenv("KVTIER_SOCKET"); e && *e) return e;
  return "./kvtier-data/kvtierd.sock";
}

StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                           const std::vector<std::string>& flags) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s.size() > 2 && s.rfind("--", 0) == 0) {
      std::string name = s.substr(2), value;
      const auto eq = name.find('=');
      bool is_flag = false;
      for (const auto& f : flags) is_flag |= (f == name);
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (!is_flag) {
        if (i + 1 >= argv.size()) return Status::Invalid("option --" + name + " needs a value");
        value = argv[++i];
      }
      a.opts_[name] = value;
    } else {
      a.pos_.push_back(s);
    }
  }
  return a;
}

std::optional<std::string> Args::Get(const std::string& name) const {
  auto it = opts_.find(name);
  if (it == opts_.end()) return std::nullopt;
  return it->second;
}

StatusOr<std::string> Args::Require(const std::string& name) const {
  auto v = Get(name);
  if (!v) return Status::Invalid("missing --" + name);
  return *v;
}

StatusOr<double> Args::GetDouble(const std::string& name, std::optional<double> def) const {
  auto v = Get(name);
  if (!v) {
    if (def) return *def;
    return Status::Invalid("missing --" + name);
  }
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || errno != 0 || !std::isfinite(d)) {
    return Status::Invalid("--" + name + " must be a finite number, got '" + *v + "'");
  }
  return d;
}

StatusOr<int64_t> Args::GetInt(const std::string& name, std::optional<int64_t> def) const {
  auto v = Get(name);
  if (!v) {
    if (def) return *def;
    return Status::Invalid("missing --" + name);
  }
  char* end = nullptr;
  errno = 0;
  const long long d = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0) {
    return Status::Invalid("--" + name + " must be an integer, got '" + *v + "'");
  }
  return static_cast<int64_t>(d);
}

Status Args::CheckKnown(const std::vector<std::string>& known) const {
  for (const auto& [k, v] : opts_) {
    bool ok = false;
    for (const auto& n : known) ok |= (n == k);
    if (!ok) return Status::Invalid("unknown option --" + k);
  }
  return Status::Ok();
}

std::map<std::string, Command>& Registry() {
  static std::map<std::string, Command> r;
  return r;
}

CommandRegistrar::CommandRegistrar(std::string name, std::string summary, CommandFn fn, std::string usage,
                                   std::vector<std::string> subcommands) {
  Registry()[name] =
      Command{name, std::move(summary), std::move(fn), std::move(usage), std::move(subcommands)};
}

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "%s: %s\n", g_program.c_str(), message.c_str());
  return code;
}

int Main(const char* program, int argc, char** argv) {
  g_program = program;
  auto usage = [&](FILE* f) {
    std::fprintf(f, "usage: %s [--socket PATH] COMMAND [ARGS...]\n       %s --version\n\ncommands:\n", program,
                 program);
    for (const auto& [name, c] : Registry()) {
      std::fprintf(f, "  %-12s %s\n", name.c_str(), c.summary.c_str());
      if (!c.subcommands.empty()) {
        std::string subs;
        for (const auto& s : c.subcommands) subs += (subs.empty() ? "" : ", ") + s;
        std::fprintf(f, "  %-12s   subcommands: %s\n", "", subs.c_str());
      }
    }
    std::fprintf(f, "\nRun '%s COMMAND --help' for a command's options.\n", program);
  };
  int first = 1;
  while (first < argc && std::strncmp(argv[first], "--socket", 8) == 0) {
    const std::string opt = argv[first];
    if (opt == "--socket" && first + 1 < argc) {
      g_socket = argv[first + 1];
      first += 2;
    } else if (opt.rfind("--socket=", 0) == 0) {
      g_socket = opt.substr(9);
      first += 1;
    } else {
      return Fail("--socket needs a path", 2);
    }
  }
  if (first >= argc) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[first];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("%s %s\n", program, KVTIER_VERSION_STRING);
    return 0;
  }
  auto it = Registry().find(cmd);
  if (it == Registry().end()) return Fail("unknown command '" + cmd + "' (try --help)", 2);
  std::vector<std::string> rest(argv + first + 1, argv + argc);
  const Command& c = it->second;
  const bool help =
      std::any_of(rest.begin(), rest.end(), [](const std::string& a) { return a == "--help" || a == "-h"; });
  if (help && c.usage.empty()) return c.fn({"--help"});
  if (help) {
    // The first line of the usage text is the synopsis, the rest the options.
    const size_t nl = c.usage.find('\n');
    std::printf("usage: %s %s %s\n\n%s\n", program, cmd.c_str(), c.usage.substr(0, nl).c_str(), c.summary.c_str());
    if (nl != std::string::npos) std::printf("%s\n", c.usage.substr(nl).c_str());
    return 0;
  }
  return c.fn(rest);
}

StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError("cannot open " + path + ": " + std::strerror(errno));
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::IoError("cannot read " + path);
  return data;
}

namespace {

// Temp files a signal removes: fixed slots the handler can read without allocating or
// locking (state 0 free, 1 being filled or emptied, 2 a path the handler unlinks).
constexpr int kTempSlots = 32;
struct TempSlot {
  std::atomic<int> state{0};
  char path[4096];
};
TempSlot g_temps[kTempSlots];

void RemoveTempsAndDie(int sig) {
  for (auto& t : g_temps) {
    if (t.state.load(std::memory_order_acquire) == 2) ::unlink(t.path);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void InstallTempHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;  // someone else's
      struct sigaction sa {};
      sa.sa_handler = RemoveTempsAndDie;
      sigemptyset(&sa.sa_mask);
      (void)::sigaction(sig, &sa, nullptr);
    }
  });
}

void RememberTemp(const std::string& tmp) {
  if (tmp.size() >= sizeof(TempSlot::path)) return;
  for (auto& t : g_temps) {
    int expect = 0;
    if (!t.state.compare_exchange_strong(expect, 1)) continue;
    std::memcpy(t.path, tmp.c_str(), tmp.size() + 1);
    t.state.store(2, std::memory_order_release);
    return;
  }
}

}  // namespace

mode_t CurrentUmask() {
  // /proc/self/status says it (Linux 4.7 on) without the umask(2) dance that changes it
  // for a moment under other threads.
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8));
  }
  const mode_t u = ::umask(022);
  ::umask(u);
  return u;
}

void ForgetTemp(const std::string& tmp) {
  for (auto& t : g_temps) {
    int expect = 2;
    if (t.state.load(std::memory_order_acquire) != 2 || std::strcmp(t.path, tmp.c_str()) != 0) continue;
    if (t.state.compare_exchange_strong(expect, 1)) t.state.store(0, std::memory_order_release);
    return;
  }
}

Status CreateTempBeside(const std::string& path, std::string* tmp, int* fd, mode_t mode) {
  InstallTempHandlers();
  std::string tmpl = path + ".tmp.XXXXXX";
  // The signals wait while the file is created and remembered: one that comes in between
  // is taken after, and then removes it.
  sigset_t block, was;
  sigemptyset(&block);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&block, sig);
  ::pthread_sigmask(SIG_BLOCK, &block, &was);
  const int f = ::mkostemp(tmpl.data(), O_CLOEXEC);
  const int create_errno = errno;
  if (f >= 0) RememberTemp(tmpl);
  ::pthread_sigmask(SIG_SETMASK, &was, nullptr);
  if (f < 0) return Status::IoError("cannot create " + path + ".tmp.*: " + std::strerror(create_errno));
  // mkostemp makes 0600: the mode open(2) would give, never more than the umask allows.
  const mode_t want = mode & ~CurrentUmask() & 0777;
  if (::fchmod(f, want) != 0) {
    const std::string err = std::strerror(errno);
    ::close(f);
    ::unlink(tmpl.c_str());
    ForgetTemp(tmpl);
    return Status::IoError("cannot set the mode of " + tmpl + ": " + err);
  }
  *tmp = std::move(tmpl);
  *fd = f;
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, const void* data, size_t n) {
  std::string tmp;
  int fd = -1;
  KVTIER_RETURN_IF_ERROR(CreateTempBeside(path, &tmp, &fd));
  auto drop = [&tmp] {
    ::unlink(tmp.c_str());
    ForgetTemp(tmp);
  };
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      drop();
      return Status::IoError("cannot write " + tmp + ": " + err);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    drop();
    return Status::IoError("cannot flush " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    drop();
    return Status::IoError("cannot rename " + tmp + " to " + path + ": " + err);
  }
  ForgetTemp(tmp);
  return Status::Ok();
}

}  // namespace kvtier::cli
