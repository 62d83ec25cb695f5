// Runs one of the built command-line tools (KVTIER_BIN_DIR/NAME) as a child process, the
// way a user runs it, and captures its exit code, stdout and stderr through files in `dir`.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kvtier::testing_tools {

struct ToolResult {
  int code = -1;
  std::string out, err;
};

inline ToolResult RunTool(const std::string& name, const std::vector<std::string>& args,
                          const std::filesystem::path& dir) {
  const std::filesystem::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const pid_t pid = fork();
  if (pid == 0) {
    std::freopen(out.c_str(), "w", stdout);
    std::freopen(err.c_str(), "w", stderr);
    std::string bin = std::string(KVTIER_BIN_DIR) + "/" + name;
    std::vector<std::string> copy = args;
    std::vector<char*> argv{bin.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ToolResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace kvtier::testing_tools
