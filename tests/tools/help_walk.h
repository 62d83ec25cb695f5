// Walks every command and subcommand a tool's top-level --help lists (tools/cli.h) and
// checks that each answers --help and -h with its usage on stdout and exit code 0, without
// running (a --socket that does not exist: a command that reached for a daemon would fail).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/tools/run_tool.h"

namespace kvtier::testing_tools {

// (command, subcommand or "") pairs, parsed from the top-level usage: a command line is
// "  NAME  summary", its subcommands follow on "  ...  subcommands: a, b".
inline std::vector<std::pair<std::string, std::string>> ListCommands(const std::string& usage) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(usage);
  std::string line;
  bool in_commands = false;
  while (std::getline(in, line)) {
    if (line == "commands:") {
      in_commands = true;
      continue;
    }
    if (!in_commands || line.rfind("  ", 0) != 0) {
      in_commands = in_commands && !line.empty();
      continue;
    }
    const size_t start = line.find_first_not_of(' ');
    const std::string rest = line.substr(start);
    const std::string kSubs = "subcommands: ";
    if (rest.rfind(kSubs, 0) == 0 && !out.empty()) {
      const std::string cmd = out.back().first;
      std::istringstream subs(rest.substr(kSubs.size()));
      std::string s;
      while (std::getline(subs, s, ',')) {
        s.erase(0, s.find_first_not_of(' '));
        out.emplace_back(cmd, s);
      }
      continue;
    }
    out.emplace_back(rest.substr(0, rest.find(' ')), "");
  }
  return out;
}

inline void ExpectEveryCommandAnswersHelp(const std::string& tool, const std::filesystem::path& dir,
                                          const std::vector<std::string>& must_list) {
  const ToolResult top = RunTool(tool, {"--help"}, dir);
  ASSERT_EQ(top.code, 0) << top.err;
  const auto cmds = ListCommands(top.out);
  // Each of must_list ("bench", or "bench replay" for a subcommand) is among them.
  for (const std::string& m : must_list) {
    bool found = false;
    for (const auto& c : cmds) found |= (c.first + (c.second.empty() ? "" : " " + c.second)) == m;
    EXPECT_TRUE(found) << tool << " --help does not list " << m << ":\n" << top.out;
  }
  const std::string no_daemon = (dir / "no-such-daemon.sock").string();
  for (const auto& [cmd, sub] : cmds) {
    std::vector<std::string> args = {"--socket", no_daemon, cmd};
    if (!sub.empty()) args.push_back(sub);
    for (const char* h : {"--help", "-h"}) {
      std::vector<std::string> a = args;
      a.push_back(h);
      const ToolResult r = RunTool(tool, a, dir);
      const std::string what = tool + " " + cmd + (sub.empty() ? "" : " " + sub) + " " + h;
      EXPECT_EQ(r.code, 0) << what << ": " << r.err;
      EXPECT_TRUE(r.err.empty()) << what << ": " << r.err;
      EXPECT_EQ(r.out.rfind("usage:", 0), 0u) << what << ":\n" << r.out;
      EXPECT_NE(r.out.find(cmd), std::string::npos) << what << ":\n" << r.out;
      if (!sub.empty()) {
        EXPECT_NE(r.out.find(sub), std::string::npos) << what << ":\n" << r.out;
      }
      EXPECT_NE(r.out.find("--"), std::string::npos) << what << " names no option:\n" << r.out;
    }
  }
}

}  // namespace kvtier::testing_tools
